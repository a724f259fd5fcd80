# A stand-in that hides an installed Horovod (tests put this folder first on PYTHONPATH).
raise ImportError("No module named 'horovod' (hidden by tests/shims/no-horovod)")
