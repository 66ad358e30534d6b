;; word_count: count the words of argv[1] (runs of characters between spaces,
;; tabs and newlines) and print the number. A WASI command module written in
;; WebAssembly text: wasmtime compiles it as it is, no toolchain needed.
(module
  (import "wasi_snapshot_preview1" "args_sizes_get" (func $args_sizes_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "args_get" (func $args_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $proc_exit (param i32)))
  ;; layout: 0 argc, 4 argv size, 16.. argv pointers (64 at most), 1024.. argv text (58,000 bytes at most),
  ;; 60000..60050 the number, 60100 an iovec, 60108 bytes written
  (memory (export "memory") 1)
  (data (i32.const 60200) "usage: word_count TEXT (at most 58,000 bytes)\n")
  (func (export "_start")
    (local $p i32) (local $c i32) (local $count i32) (local $in_word i32) (local $n i32) (local $out i32)
    (drop (call $args_sizes_get (i32.const 0) (i32.const 4)))
    (if (i32.or (i32.ne (i32.load (i32.const 0)) (i32.const 2))
                (i32.gt_u (i32.load (i32.const 4)) (i32.const 58000)))
      (then
        (i32.store (i32.const 60100) (i32.const 60200))
        (i32.store (i32.const 60104) (i32.const 46))
        (drop (call $fd_write (i32.const 2) (i32.const 60100) (i32.const 1) (i32.const 60108)))
        (call $proc_exit (i32.const 2))))
    (drop (call $args_get (i32.const 16) (i32.const 1024)))
    (local.set $p (i32.load (i32.const 20)))
    (block $done
      (loop $scan
        (local.set $c (i32.load8_u (local.get $p)))
        (br_if $done (i32.eqz (local.get $c)))
        (if (i32.or (i32.or (i32.eq (local.get $c) (i32.const 32)) (i32.eq (local.get $c) (i32.const 10)))
                    (i32.or (i32.eq (local.get $c) (i32.const 9)) (i32.eq (local.get $c) (i32.const 13))))
          (then (local.set $in_word (i32.const 0)))
          (else
            (if (i32.eqz (local.get $in_word))
              (then
                (local.set $count (i32.add (local.get $count) (i32.const 1)))
                (local.set $in_word (i32.const 1))))))
        (local.set $p (i32.add (local.get $p) (i32.const 1)))
        (br $scan)))
    ;; the count in decimal, written right to left before a newline at 60050
    (local.set $out (i32.const 60050))
    (i32.store8 (local.get $out) (i32.const 10))
    (local.set $n (local.get $count))
    (loop $digits
      (local.set $out (i32.sub (local.get $out) (i32.const 1)))
      (i32.store8 (local.get $out) (i32.add (i32.const 48) (i32.rem_u (local.get $n) (i32.const 10))))
      (local.set $n (i32.div_u (local.get $n) (i32.const 10)))
      (br_if $digits (i32.ne (local.get $n) (i32.const 0))))
    (i32.store (i32.const 60100) (local.get $out))
    (i32.store (i32.const 60104) (i32.sub (i32.const 60051) (local.get $out)))
    (drop (call $fd_write (i32.const 1) (i32.const 60100) (i32.const 1) (i32.const 60108)))))
