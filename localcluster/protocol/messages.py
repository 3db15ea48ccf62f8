"""kio-encoded messages: every API but the hot path (Produce records, Fetch bodies).

Handlers build responses as plain dicts and lists in Kafka's field names (snake_case, as kio
spells them); `encode_response` turns them into the kio dataclasses of the negotiated version,
dropping fields that version lacks and filling fields the dict leaves out with zero values,
so one handler serves every version. Durations are milliseconds in the dicts.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import io
import typing
from collections.abc import Iterable, Mapping
from types import NoneType, UnionType
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from kio.serial.errors import SerialError

from localcluster.protocol.wire import MalformedRequestError

_TIMEDELTA_TYPES = {"timedelta_i32", "timedelta_i64"}
_ZERO = {"string": "", "bool": False, "bytes": b"", "records": None, "uuid": None}


@functools.cache
def request_schema(api_key: int, version: int) -> type:
    return load_request_schema(api_key, version)


@functools.cache
def response_schema(api_key: int, version: int) -> type:
    return load_response_schema(api_key, version)


def preload(apis: Iterable[tuple[int, int]]) -> None:
    """Load the request and response schemas of these (api key, version) pairs and build
    their codecs now. The first use of a pair imports kio's generated modules, 10-15 ms of the
    event loop each: paid where a request first needs it, that lands in a failover (a
    follower's first OffsetForLeaderEpoch after a leader change, on both brokers)."""
    for api_key, version in apis:
        for schema in (request_schema(api_key, version), response_schema(api_key, version)):
            entity_reader(schema)
            entity_writer(schema)
            _fields(schema)


def decode_request(api_key: int, version: int, buf, offset: int) -> Any:
    """The kio dataclass of a request body starting at `offset`."""
    schema = request_schema(api_key, version)
    try:
        entity, _ = entity_reader(schema)(memoryview(buf).toreadonly(), offset)
    except (SerialError, ValueError, TypeError, UnicodeDecodeError) as e:
        raise MalformedRequestError(f"{schema.__name__} v{version} does not parse: {e}") from e
    return entity


def decode_response(api_key: int, version: int, buf, offset: int = 0) -> Any:
    schema = response_schema(api_key, version)
    entity, _ = entity_reader(schema)(memoryview(buf).toreadonly(), offset)
    return entity


def encode_response(api_key: int, version: int, data: Mapping) -> bytes:
    schema = response_schema(api_key, version)
    return encode_entity(schema, data)


def read_request(header, reader) -> Any:
    """The body of the request `header` names, read from where `reader` stands."""
    return decode_request(header.api_key, header.api_version, reader.buf, reader.pos)


def write_response(header, data: Mapping) -> bytes:
    """The response to `header`'s request, with Kafka's throttle_time of 0 (never throttled)."""
    return encode_response(header.api_key, header.api_version, {"throttle_time": 0, **data})


def encode_request(api_key: int, version: int, data: Mapping) -> bytes:
    return encode_entity(request_schema(api_key, version), data)


def encode_entity(schema: type, data: Mapping) -> bytes:
    out = io.BytesIO()
    entity_writer(schema)(out, build(schema, data))
    return out.getvalue()


def build(schema: type, data: Mapping) -> Any:
    """An instance of the kio dataclass `schema` from a dict, recursively."""
    values = {}
    for field, nested in _fields(schema):
        if field.name in data:
            value = data[field.name]
        elif (
            field.default is not dataclasses.MISSING
            or field.default_factory is not dataclasses.MISSING
        ):
            continue
        else:
            value = _zero(field, nested)
        values[field.name] = _convert(field, nested, value)
    return schema(**values)


def _convert(field: dataclasses.Field, nested: type | None, value: Any) -> Any:
    kafka_type = field.metadata.get("kafka_type")
    if nested is not None:
        if isinstance(value, list | tuple):
            return tuple(build(nested, v) for v in value)
        return None if value is None else build(nested, value)
    if kafka_type in _TIMEDELTA_TYPES and isinstance(value, int):
        return datetime.timedelta(milliseconds=value)
    if kafka_type == "error_code":
        return ErrorCode(int(value))
    if isinstance(value, list):
        return tuple(value)
    return value


def _zero(field: dataclasses.Field, nested: type | None) -> Any:
    if _is_tuple(field.type):
        return ()
    if nested is not None:
        return None if _is_optional(field.type) else {}
    kafka_type = field.metadata.get("kafka_type", "")
    if kafka_type in _TIMEDELTA_TYPES:
        return 0
    if _is_optional(field.type):
        return None
    return _ZERO.get(kafka_type, 0)


@functools.cache
def _fields(schema: type) -> tuple[tuple[dataclasses.Field, type | None], ...]:
    # kio's generated modules hold real types in Field.type (no postponed annotations).
    return tuple((f, _nested_entity(f.type)) for f in dataclasses.fields(schema))


def _nested_entity(annotation: Any) -> type | None:
    """The entity class inside `X`, `tuple[X, ...]` and `tuple[X, ...] | None` (nullable
    arrays such as Metadata v1+ request topics), else None."""
    if dataclasses.is_dataclass(annotation):
        return annotation
    for arg in typing.get_args(annotation):
        if arg is not Ellipsis and arg is not NoneType:
            found = _nested_entity(arg)
            if found is not None:
                return found
    return None


def _is_tuple(annotation: Any) -> bool:
    return typing.get_origin(annotation) is tuple


def _is_optional(annotation: Any) -> bool:
    return (typing.get_origin(annotation) in (typing.Union, UnionType)
            and NoneType in typing.get_args(annotation))  # fmt: skip
