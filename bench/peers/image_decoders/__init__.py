"""The JPEG libraries timed side by side on one core, to choose the image stage's decoder:
``python -m bench.peers.image_decoders`` (:mod:`~bench.peers.image_decoders.__main__`). Nothing is imported here."""
