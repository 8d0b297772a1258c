#!/usr/bin/python3
"""Reads TensorBoard event files independently of primus's writer, and prints their scalars as JSON.

    read_events.py DIR   ->  {"files": N, "file_version": "...", "scalars": {tag: [[step, value], ...]}}

The TFRecord framing is checked with Debian's python3-crc32c (masked CRC32C of the length and of the
payload); each payload is parsed by Google's protobuf runtime (python3-protobuf) against the
`Event` / `Summary` / `Summary.Value` messages declared below with TensorBoard's field numbers
(tensorboard/compat/proto/event.proto and summary.proto). Any damage is an error (exit 1).
"""
import glob
import json
import os
import struct
import sys

import crc32c
from google.protobuf import descriptor_pb2, descriptor_pool
try:
    from google.protobuf.message_factory import GetMessageClass
except ImportError:  # protobuf < 4.22
    from google.protobuf.message_factory import MessageFactory
    GetMessageClass = lambda d: MessageFactory().GetPrototype(d)


def messages():
    F = descriptor_pb2.FieldDescriptorProto
    f = descriptor_pb2.FileDescriptorProto(name="primus_test_event.proto", package="tbtest", syntax="proto3")

    def field(msg, name, number, ftype, label=F.LABEL_OPTIONAL, type_name=None):
        d = msg.field.add(name=name, number=number, type=ftype, label=label)
        if type_name:
            d.type_name = type_name

    value = f.message_type.add(name="Value")
    field(value, "node_name", 7, F.TYPE_STRING)
    field(value, "tag", 1, F.TYPE_STRING)
    field(value, "simple_value", 2, F.TYPE_FLOAT)
    summary = f.message_type.add(name="Summary")
    field(summary, "value", 1, F.TYPE_MESSAGE, F.LABEL_REPEATED, ".tbtest.Value")
    event = f.message_type.add(name="Event")
    field(event, "wall_time", 1, F.TYPE_DOUBLE)
    field(event, "step", 2, F.TYPE_INT64)
    field(event, "file_version", 3, F.TYPE_STRING)
    field(event, "graph_def", 4, F.TYPE_BYTES)
    field(event, "summary", 5, F.TYPE_MESSAGE, type_name=".tbtest.Summary")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return GetMessageClass(pool.FindMessageTypeByName("tbtest.Event"))


def masked(data):
    c = crc32c.crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def records(path):
    with open(path, "rb") as fh:
        data = fh.read()
    pos = 0
    while pos < len(data):
        if pos + 12 > len(data):
            raise ValueError(f"{path}: truncated record header at byte {pos}")
        (length,) = struct.unpack_from("<Q", data, pos)
        (len_crc,) = struct.unpack_from("<I", data, pos + 8)
        if masked(data[pos:pos + 8]) != len_crc:
            raise ValueError(f"{path}: bad length CRC at byte {pos}")
        payload = data[pos + 12:pos + 12 + length]
        if len(payload) != length or pos + 16 + length > len(data):
            raise ValueError(f"{path}: truncated record at byte {pos}")
        (data_crc,) = struct.unpack_from("<I", data, pos + 12 + length)
        if masked(payload) != data_crc:
            raise ValueError(f"{path}: bad payload CRC at byte {pos}")
        yield payload
        pos += 16 + length


def main():
    Event = messages()
    files = sorted(glob.glob(os.path.join(sys.argv[1], "*tfevents*")))
    out = {"files": len(files), "file_version": None, "scalars": {}}
    for path in files:
        for i, payload in enumerate(records(path)):
            e = Event()
            e.ParseFromString(payload)
            if i == 0:
                if not e.file_version:
                    raise ValueError(f"{path}: the first event has no file_version")
                out["file_version"] = e.file_version
                continue
            if e.wall_time <= 0:
                raise ValueError(f"{path}: event {i} has no wall_time")
            for v in e.summary.value:
                out["scalars"].setdefault(v.tag, []).append([e.step, v.simple_value])
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    try:
        main()
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
