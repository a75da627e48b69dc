"""The bench's order event (bench/common.order_event) as a protobuf message, built at import from
a FileDescriptorProto, so the protobuf route needs no protoc: `bench.orders_pb2:Order`."""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_T = descriptor_pb2.FieldDescriptorProto
FIELDS = (
    ("order_id", _T.TYPE_INT64),
    ("customer_id", _T.TYPE_STRING),
    ("status", _T.TYPE_STRING),
    ("amount", _T.TYPE_DOUBLE),
    ("currency", _T.TYPE_STRING),
    ("items", _T.TYPE_INT64),
    ("channel", _T.TYPE_STRING),
    ("country", _T.TYPE_STRING),
    ("created_at", _T.TYPE_STRING),
    ("note", _T.TYPE_STRING),
)


def _file() -> descriptor_pb2.FileDescriptorProto:
    file = descriptor_pb2.FileDescriptorProto(name="dpone_bench_orders.proto", package="dpone.bench", syntax="proto3")
    message = file.message_type.add(name="Order")
    for number, (name, kind) in enumerate(FIELDS, start=1):
        message.field.add(name=name, number=number, type=kind, label=_T.LABEL_OPTIONAL, json_name=name)
    return file


_pool = descriptor_pool.Default()
try:
    DESCRIPTOR = _pool.FindFileByName("dpone_bench_orders.proto")
except KeyError:
    DESCRIPTOR = _pool.Add(_file())
Order = message_factory.GetMessageClass(DESCRIPTOR.message_types_by_name["Order"])
