"""Device backends (CPU, CUDA) with their memory: the device arena, host buffers (pool, huge pages) and the CPU backend's measured temporaries."""
