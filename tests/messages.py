"""Messages as the SuperLink delivers them to a ClientApp, and replies to a ServerApp, for tests."""

from __future__ import annotations

import time
import uuid

from flwr.app import DEFAULT_TTL, Message, Metadata, RecordDict


def delivered(content, message_type: str, *, dst_node_id: int = 11) -> Message:
    """A message of ``message_type`` with ``content`` (a RecordDict or a mapping of records).

    ``Message(content, dst_node_id, message_type)`` needs a running ServerApp's identity, so the
    metadata is given explicitly.
    """
    metadata = Metadata(
        run_id=1,
        message_id="m1",
        src_node_id=0,
        dst_node_id=dst_node_id,
        reply_to_message_id="",
        group_id="2",
        created_at=time.time(),
        ttl=DEFAULT_TTL,
        message_type=message_type,
    )
    return Message(content=RecordDict(content), metadata=metadata)


def reply_metadata(msg: Message, src_node_id: int) -> Metadata:
    """The metadata of node ``src_node_id``'s reply to ``msg``, as the SuperLink delivers it."""
    return Metadata(
        run_id=1,
        message_id=uuid.uuid4().hex,
        src_node_id=src_node_id,
        dst_node_id=0,
        reply_to_message_id=msg.metadata.message_id,
        group_id=msg.metadata.group_id,
        created_at=0.0,
        ttl=3600.0,
        message_type=msg.metadata.message_type,
    )
