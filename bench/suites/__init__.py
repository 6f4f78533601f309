"""The suites of ``python -m bench``, one module each (``<name>_suite.py``), with what only one suite uses: the train
suite's measuring process (``train_measure``), the images suite's kernel alone (``image_kernel``); and the daemon's
run as the suites that time it share it (``daemon_runs``). Nothing is imported here: a suite's measuring process
runs its module (``python -m bench.suites.<module>``)."""
