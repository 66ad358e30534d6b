;; hostile: crashes (a panic in most languages ends this way)
(module (memory (export "memory") 1) (func (export "_start") unreachable))
