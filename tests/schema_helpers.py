"""Schemas and Protobuf classes the format tests share (built at run time: no protoc here)."""

from __future__ import annotations

import functools
from typing import Any

PV_V1: dict[str, Any] = {
    "type": "record",
    "name": "PageView",
    "namespace": "shop.events",
    "fields": [
        {"name": "app_id", "type": "string"},
        {"name": "n", "type": "int"},
    ],
}

#: v1 + a field with a default, ``n`` promoted to long: BACKWARD compatible with v1
PV_V2: dict[str, Any] = {
    "type": "record",
    "name": "PageView",
    "namespace": "shop.events",
    "fields": [
        {"name": "app_id", "type": "string"},
        {"name": "n", "type": "long"},
        {"name": "region", "type": "string", "default": "eu"},
    ],
}

#: a field without a default that v1 lacks: not BACKWARD compatible
PV_BAD: dict[str, Any] = {
    "type": "record",
    "name": "PageView",
    "namespace": "shop.events",
    "fields": [
        {"name": "app_id", "type": "string"},
        {"name": "user", "type": "string"},
    ],
}

PV_JSON_SCHEMA: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "PageView",
    "type": "object",
    "properties": {"app_id": {"type": "string"}, "n": {"type": "integer"}},
    "required": ["app_id", "n"],
}


@functools.cache
def proto_classes() -> dict[str, Any]:
    """``shop.Order`` (nested ``Line``, an enum, a map) importing ``shop.Money`` from another file.

    Files: ``shop/money.proto`` (Money) and ``shop/orders.proto`` (Refund first,
    then Order: Order's message indexes are ``[1]``, Order.Line's ``[1, 0]``).
    """
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    fdp = descriptor_pb2.FieldDescriptorProto
    pool = descriptor_pool.DescriptorPool()

    money = descriptor_pb2.FileDescriptorProto(
        name="shop/money.proto", package="shop", syntax="proto3"
    )
    m = money.message_type.add(name="Money")
    m.field.add(name="cents", number=1, type=fdp.TYPE_INT64, label=fdp.LABEL_OPTIONAL)
    m.field.add(name="currency", number=2, type=fdp.TYPE_STRING, label=fdp.LABEL_OPTIONAL)
    pool.Add(money)

    orders = descriptor_pb2.FileDescriptorProto(
        name="shop/orders.proto", package="shop", syntax="proto3", dependency=["shop/money.proto"]
    )
    refund = orders.message_type.add(name="Refund")
    refund.field.add(name="order_id", number=1, type=fdp.TYPE_STRING, label=fdp.LABEL_OPTIONAL)
    order = orders.message_type.add(name="Order")
    line = order.nested_type.add(name="Line")
    line.field.add(name="sku", number=1, type=fdp.TYPE_STRING, label=fdp.LABEL_OPTIONAL)
    line.field.add(name="qty", number=2, type=fdp.TYPE_INT32, label=fdp.LABEL_OPTIONAL)
    entry = order.nested_type.add(name="AttrsEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=fdp.TYPE_STRING, label=fdp.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=fdp.TYPE_INT64, label=fdp.LABEL_OPTIONAL)
    status = order.enum_type.add(name="Status")
    status.value.add(name="NEW", number=0)
    status.value.add(name="PAID", number=1)
    add = order.field.add
    add(name="id", number=1, type=fdp.TYPE_STRING, label=fdp.LABEL_OPTIONAL)
    add(name="qty", number=2, type=fdp.TYPE_INT64, label=fdp.LABEL_OPTIONAL)
    add(
        name="status",
        number=3,
        type=fdp.TYPE_ENUM,
        type_name=".shop.Order.Status",
        label=fdp.LABEL_OPTIONAL,
    )
    add(
        name="lines",
        number=4,
        type=fdp.TYPE_MESSAGE,
        type_name=".shop.Order.Line",
        label=fdp.LABEL_REPEATED,
    )
    add(
        name="attrs",
        number=5,
        type=fdp.TYPE_MESSAGE,
        type_name=".shop.Order.AttrsEntry",
        label=fdp.LABEL_REPEATED,
    )
    add(
        name="total",
        number=6,
        type=fdp.TYPE_MESSAGE,
        type_name=".shop.Money",
        label=fdp.LABEL_OPTIONAL,
    )
    pool.Add(orders)

    def cls(name: str) -> Any:
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))

    return {n: cls(f"shop.{n}") for n in ("Money", "Refund", "Order", "Order.Line")}
