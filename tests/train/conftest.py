def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA device (skipped without one; benchmarks/gpu_check.sh runs them)")
