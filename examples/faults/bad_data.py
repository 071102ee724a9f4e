"""Bad data: a record of the input has no 'text' field."""

import json

import trackway
from _loop import train

RECORDS = ['{"text": "a"}', '{"text": "b"}', '{"txt": "c"}']


def fault(run, step):
    record = json.loads(RECORDS[step % len(RECORDS)])
    if "text" not in record:
        raise trackway.BadData(f"record {step % len(RECORDS)}: no 'text' field (keys: {sorted(record)})")


train(at_step=fault)
