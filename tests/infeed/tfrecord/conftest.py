import pytest

from infeed.tfrecord.filesystems import registered_filesystems, restore_registered_filesystems, unregister_filesystem


@pytest.fixture
def clean_registry():
    """The filesystem registry as it was before the test, whatever the test registered or removed."""
    saved = registered_filesystems()
    yield
    for entry in registered_filesystems():
        unregister_filesystem(entry["prefix"])
    restore_registered_filesystems(saved)
