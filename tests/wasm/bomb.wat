;; hostile: grows its memory 1 MiB at a time and touches every new page; when a
;; growth is refused it writes past its end anyway
(module
  (memory (export "memory") 1)
  (func (export "_start") (local $old i32)
    (loop $grow
      (local.set $old (memory.grow (i32.const 16)))
      (if (i32.eq (local.get $old) (i32.const -1))
        (then (i32.store (i32.mul (memory.size) (i32.const 65536)) (i32.const 1))))
      (i32.store (i32.mul (local.get $old) (i32.const 65536)) (i32.const 1))
      (br $grow))))
