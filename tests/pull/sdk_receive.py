"""Receive with Microsoft's Python SDK (azure-eventgrid), unmodified, and print what each event's
data became on the client side.

Usage: sdk_receive.py ENDPOINT KEY TOPIC SUBSCRIPTION. Prints one JSON object, by event id:
{"type": <python type name of event.data>, "data": <the data; bytes as latin-1 text>,
"datacontenttype": ...}; acknowledges what it received.
"""
import json
import sys

from azure.core.credentials import AzureKeyCredential
from azure.eventgrid import EventGridConsumerClient

endpoint, key, topic, sub = sys.argv[1:5]
con = EventGridConsumerClient(endpoint, AzureKeyCredential(key), namespace_topic=topic, subscription=sub)
got = con.receive(max_events=10, max_wait_time=10)
out = {}
for d in got:
    data = d.event.data
    out[d.event.id] = {
        "type": type(data).__name__,
        "data": data.decode("latin-1") if isinstance(data, (bytes, bytearray)) else data,
        "datacontenttype": d.event.datacontenttype,
    }
con.acknowledge(lock_tokens=[d.broker_properties.lock_token for d in got])
print(json.dumps(out))
