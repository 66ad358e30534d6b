;; waits on the host: asks poll_oneoff to sleep 60 s (a relative clock subscription), then prints "woke"
(module
  (import "wasi_snapshot_preview1" "poll_oneoff" (func $poll (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  ;; subscription at 0: userdata 0, tag 0 (clock), clock id 1 (monotonic) at 16, timeout 60e9 ns at 24
  (data (i32.const 16) "\01\00\00\00")
  (data (i32.const 24) "\00\58\47\f8\0d\00\00\00")
  (data (i32.const 200) "woke\n")
  (func (export "_start")
    (drop (call $poll (i32.const 0) (i32.const 100) (i32.const 1) (i32.const 140)))
    (i32.store (i32.const 152) (i32.const 200))
    (i32.store (i32.const 156) (i32.const 5))
    (drop (call $write (i32.const 1) (i32.const 152) (i32.const 1) (i32.const 160)))))
