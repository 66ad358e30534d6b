;; floods: BEGIN, 10 MiB of 'x', END
(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 2)
  (data (i32.const 100) "BEGIN\n")
  (data (i32.const 200) "END\n")
  (func $out (param $ptr i32) (param $len i32)
    (i32.store (i32.const 0) (local.get $ptr)) (i32.store (i32.const 4) (local.get $len))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8))))
  (func (export "_start") (local $i i32)
    (memory.fill (i32.const 65536) (i32.const 120) (i32.const 65536))
    (call $out (i32.const 100) (i32.const 6))
    (loop $more
      (call $out (i32.const 65536) (i32.const 65536))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $more (i32.lt_u (local.get $i) (i32.const 160))))
    (call $out (i32.const 200) (i32.const 4))))
