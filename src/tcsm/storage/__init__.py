"""What lands on disk: the one atomic write (`fileio`), checkpoint directories in safetensors (`checkpoint`), and the
readers of older saved runs and configs."""
