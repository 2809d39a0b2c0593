"""Namespace subscription filters seen through Microsoft's Python SDK (azure-eventgrid),
unmodified.

Usage: sdk_filters.py ENDPOINT KEY TOPIC SUB [SUB ...]. Publishes four CloudEvents that between
them hit every documented rule (a number in and out of ranges, strings that do and do not begin,
end with or contain a value, a null and a missing key, an array), then receives from each
subscription and prints, as one JSON object, the ids each one got (tests/it/pull_sdk.rs checks
them against the rules).
"""
import json
import sys

from azure.core.credentials import AzureKeyCredential
from azure.core.messaging import CloudEvent
from azure.eventgrid import EventGridConsumerClient, EventGridPublisherClient

endpoint, key, topic, *subs = sys.argv[1:]
cred = AzureKeyCredential(key)
pub = EventGridPublisherClient(endpoint, cred, namespace_topic=topic)
pub.send(
    [
        CloudEvent(source="/f", type="f", id="e1",
                   data={"n": 500, "s": "Event hubs", "tags": ["Azure", "x"], "b": True}),
        CloudEvent(source="/f", type="f", id="e2", data={"n": 3500, "s": "a.PNG", "tags": [1, 2]}),
        CloudEvent(source="/f", type="f", id="e3", data={"n": 1000, "s": None}),
        CloudEvent(source="/f", type="f", id="e4", data={}),
    ]
)
out = {}
for sub in subs:
    con = EventGridConsumerClient(endpoint, cred, namespace_topic=topic, subscription=sub)
    got = con.receive(max_events=10, max_wait_time=10)
    out[sub] = sorted(d.event.id for d in got)
    con.acknowledge(lock_tokens=[d.broker_properties.lock_token for d in got])
print(json.dumps(out))
