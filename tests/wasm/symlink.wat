;; hostile: tries to create /data/escape -> /etc/passwd in its writable mount (preopened as fd 3)
(module
  (import "wasi_snapshot_preview1" "path_symlink" (func $symlink (param i32 i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "/etc/passwd")
  (data (i32.const 32) "escape")
  (func (export "_start")
    (call $exit (call $symlink (i32.const 0) (i32.const 11) (i32.const 3) (i32.const 32) (i32.const 6)))))
