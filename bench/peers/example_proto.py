"""``tf.train.Example`` as a protobuf message class built from its descriptor: no TensorFlow, no protoc.

Grain's own path in ``python -m bench grain`` decodes with it, and the tests
check infeed's reference decoder against it.
"""


def example_class():
    """``tf.train.Example`` as a protobuf message class, built from its descriptor (no TensorFlow, no protoc)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="infeed_example.proto", package="infeedexample",
                                               syntax="proto3")

    def message(name, *fields):
        m = proto.message_type.add(name=name)
        for f in fields:
            m.field.add().CopyFrom(f)
        return m

    rep, opt = F.LABEL_REPEATED, F.LABEL_OPTIONAL
    message("BytesList", F(name="value", number=1, label=rep, type=F.TYPE_BYTES))
    message("FloatList", F(name="value", number=1, label=rep, type=F.TYPE_FLOAT))
    message("Int64List", F(name="value", number=1, label=rep, type=F.TYPE_INT64))
    feature = message("Feature", *[
        F(name=n, number=i, label=opt, type=F.TYPE_MESSAGE, type_name=f".infeedexample.{t}", oneof_index=0)
        for i, (n, t) in enumerate([("bytes_list", "BytesList"), ("float_list", "FloatList"),
                                    ("int64_list", "Int64List")], 1)])
    feature.oneof_decl.add(name="kind")
    features = message("Features", F(name="feature", number=1, label=rep, type=F.TYPE_MESSAGE,
                                     type_name=".infeedexample.Features.FeatureEntry"))
    entry = features.nested_type.add(name="FeatureEntry")
    entry.field.add(name="key", number=1, label=opt, type=F.TYPE_STRING)
    entry.field.add(name="value", number=2, label=opt, type=F.TYPE_MESSAGE, type_name=".infeedexample.Feature")
    entry.options.map_entry = True
    message("Example", F(name="features", number=1, label=opt, type=F.TYPE_MESSAGE,
                         type_name=".infeedexample.Features"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("infeedexample.Example"))
