"""``tf.train.Example`` without tensorflow: the same messages (``tensorflow/core/example/{example,feature}.proto``,
proto3), built from their descriptor in a pool of their own, so that reading and writing TFRecords of Examples
needs the ``protobuf`` package only.

The wire format is tensorflow's: a message parsed here and serialized (``deterministic=True``) gives the bytes
``tf.train.Example`` gives, and either parses the other's bytes (tests/batch/test_batch_example.py). The private pool
keeps these classes apart from tensorflow's when both are imported in one process. ``batch.example.Example`` is the
class too (built on first use), so that Examples pickle (batch-score --ray sends parsed chunks to its actors).
"""

from __future__ import annotations

import functools
from typing import Any

_PACKAGE = "tensorflow"


@functools.cache
def example_class() -> Any:
    """The ``Example`` message class (``Example.features.feature[key].bytes_list.value``, as tensorflow's)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    proto = descriptor_pb2.FileDescriptorProto(name="mtgate/batch/example.proto", package=_PACKAGE, syntax="proto3")
    label = descriptor_pb2.FieldDescriptorProto
    for name, scalar in (("BytesList", label.TYPE_BYTES), ("FloatList", label.TYPE_FLOAT),
                         ("Int64List", label.TYPE_INT64)):
        message = proto.message_type.add(name=name)
        message.field.add(name="value", number=1, label=label.LABEL_REPEATED, type=scalar)
    feature = proto.message_type.add(name="Feature")
    feature.oneof_decl.add(name="kind")
    for number, (name, type_name) in enumerate((("bytes_list", "BytesList"), ("float_list", "FloatList"),
                                                ("int64_list", "Int64List")), start=1):
        feature.field.add(name=name, number=number, label=label.LABEL_OPTIONAL, type=label.TYPE_MESSAGE,
                          type_name=f".{_PACKAGE}.{type_name}", oneof_index=0)
    features = proto.message_type.add(name="Features")
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, label=label.LABEL_OPTIONAL, type=label.TYPE_STRING)
    entry.field.add(name="value", number=2, label=label.LABEL_OPTIONAL, type=label.TYPE_MESSAGE,
                    type_name=f".{_PACKAGE}.Feature")
    features.field.add(name="feature", number=1, label=label.LABEL_REPEATED, type=label.TYPE_MESSAGE,
                       type_name=f".{_PACKAGE}.Features.FeatureEntry")
    example = proto.message_type.add(name="Example")
    example.field.add(name="features", number=1, label=label.LABEL_OPTIONAL, type=label.TYPE_MESSAGE,
                      type_name=f".{_PACKAGE}.Features")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.Example"))
    cls.__module__, cls.__qualname__ = __name__, "Example"  # where pickle finds it: this module's Example
    return cls


def __getattr__(name: str) -> Any:
    if name == "Example":
        return example_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
