"""What infeed is measured against, or through: object stores on loopback (:mod:`~bench.peers.object_stores`) and a
proxy that gives them a real store's manners (:mod:`~bench.peers.store_proxy`); W processes parsing alone
(:mod:`~bench.peers.parallel_parse`); Grain's own protobuf path (:mod:`~bench.peers.example_proto`); the JPEG
libraries (:mod:`~bench.peers.image_decoders`). Nothing is imported here: several run as processes of their own."""
