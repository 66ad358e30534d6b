;; notes: `notes read PATH` prints a file, `notes write PATH` writes one line to
;; it; PATH is relative to the module's first mount (file descriptor 3). The
;; mount is the module's whole world: `..` or a symlink out of it finds nothing.
(module
  (import "wasi_snapshot_preview1" "args_sizes_get" (func $args_sizes_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "args_get" (func $args_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_read" (func $fd_read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_open"
    (func $path_open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $proc_exit (param i32)))
  ;; layout: 0 argc, 4 argv size, 16.. argv pointers, 1024.. argv text (8 KiB at most),
  ;; 16384 an iovec, 16392 a byte count, 16400 an opened fd, 20000.. messages, 32768.. a 32 KiB buffer
  (memory (export "memory") 2)
  (data (i32.const 20000) "usage: notes read|write PATH\n")
  (data (i32.const 20100) "read")
  (data (i32.const 20110) "write")
  (data (i32.const 20200) "cannot open it: WASI error ")
  (data (i32.const 20300) "written by a wasm tool\n")

  (func $strlen (param $p i32) (result i32) (local $n i32)
    (block $end
      (loop $next
        (br_if $end (i32.eqz (i32.load8_u (i32.add (local.get $p) (local.get $n)))))
        (local.set $n (i32.add (local.get $n) (i32.const 1)))
        (br $next)))
    (local.get $n))

  (func $write (param $fd i32) (param $ptr i32) (param $len i32)
    (i32.store (i32.const 16384) (local.get $ptr))
    (i32.store (i32.const 16388) (local.get $len))
    (drop (call $fd_write (local.get $fd) (i32.const 16384) (i32.const 1) (i32.const 16392))))

  (func $is (param $arg i32) (param $word i32) (param $len i32) (result i32) (local $i i32)
    (if (i32.ne (call $strlen (local.get $arg)) (local.get $len)) (then (return (i32.const 0))))
    (block $end
      (loop $next
        (br_if $end (i32.ge_u (local.get $i) (local.get $len)))
        (if (i32.ne (i32.load8_u (i32.add (local.get $arg) (local.get $i)))
                    (i32.load8_u (i32.add (local.get $word) (local.get $i))))
          (then (return (i32.const 0))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next)))
    (i32.const 1))

  (func $fail (param $errno i32)
    (call $write (i32.const 2) (i32.const 20200) (i32.const 27))
    (i32.store8 (i32.const 20400) (i32.add (i32.const 48) (i32.div_u (local.get $errno) (i32.const 10))))
    (i32.store8 (i32.const 20401) (i32.add (i32.const 48) (i32.rem_u (local.get $errno) (i32.const 10))))
    (i32.store8 (i32.const 20402) (i32.const 10))
    (call $write (i32.const 2) (i32.const 20400) (i32.const 3))
    (call $proc_exit (i32.const 1)))

  (func $open (param $path i32) (param $oflags i32) (param $rights i64) (result i32) (local $errno i32)
    (local.set $errno
      (call $path_open (i32.const 3) (i32.const 0) (local.get $path) (call $strlen (local.get $path))
                       (local.get $oflags) (local.get $rights) (i64.const 0) (i32.const 0) (i32.const 16400)))
    (if (local.get $errno) (then (call $fail (local.get $errno))))
    (i32.load (i32.const 16400)))

  (func (export "_start") (local $mode i32) (local $path i32) (local $fd i32) (local $n i32) (local $errno i32)
    (drop (call $args_sizes_get (i32.const 0) (i32.const 4)))
    (if (i32.or (i32.ne (i32.load (i32.const 0)) (i32.const 3))
                (i32.gt_u (i32.load (i32.const 4)) (i32.const 8192)))
      (then (call $write (i32.const 2) (i32.const 20000) (i32.const 29)) (call $proc_exit (i32.const 2))))
    (drop (call $args_get (i32.const 16) (i32.const 1024)))
    (local.set $mode (i32.load (i32.const 20)))
    (local.set $path (i32.load (i32.const 24)))
    (if (call $is (local.get $mode) (i32.const 20100) (i32.const 4))
      (then
        (local.set $fd (call $open (local.get $path) (i32.const 0) (i64.const 2)))  ;; rights: fd_read
        (block $eof
          (loop $copy
            (i32.store (i32.const 16384) (i32.const 32768))
            (i32.store (i32.const 16388) (i32.const 32768))
            (local.set $errno (call $fd_read (local.get $fd) (i32.const 16384) (i32.const 1) (i32.const 16392)))
            (if (local.get $errno) (then (call $fail (local.get $errno))))
            (local.set $n (i32.load (i32.const 16392)))
            (br_if $eof (i32.eqz (local.get $n)))
            (call $write (i32.const 1) (i32.const 32768) (local.get $n))
            (br $copy)))
        (return)))
    (if (call $is (local.get $mode) (i32.const 20110) (i32.const 5))
      (then
        ;; oflags: create and truncate; rights: fd_write
        (local.set $fd (call $open (local.get $path) (i32.const 9) (i64.const 64)))
        (call $write (local.get $fd) (i32.const 20300) (i32.const 23))
        (return)))
    (call $write (i32.const 2) (i32.const 20000) (i32.const 29))
    (call $proc_exit (i32.const 2))))
