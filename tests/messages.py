"""Messages as the SuperLink delivers them to a ClientApp, for tests that call one directly."""

from __future__ import annotations

import time

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
