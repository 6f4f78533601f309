"""The compiled extensions: a clear error when they are not built."""

import subprocess
import sys

BLOCK = """
import sys
class NotBuilt:
    def find_spec(self, name, path=None, target=None):
        if name == "infeed.example._example":
            raise ImportError("No module named 'infeed.example._example'")
sys.meta_path.insert(0, NotBuilt())
import infeed
"""


def test_import_without_the_extensions_names_the_command_that_builds_them():
    proc = subprocess.run([sys.executable, "-c", BLOCK], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert "Cython extensions are not built" in last and "pip install -e ." in last
