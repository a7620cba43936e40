"""The process a job runs in: thread pools, host memory guards, the run lock, RNG state, a shadowing module."""
