"""Pull delivery with Microsoft's Python SDK (azure-eventgrid), unmodified, against gridlet.

Usage: sdk_pull.py ENDPOINT KEY TOPIC SUBSCRIPTION. Publishes with EventGridPublisherClient
(namespace_topic), receives and settles with EventGridConsumerClient, and prints what it saw as
one JSON object for the Rust test (tests/it/pull_sdk.rs) to check.
"""
import json
import sys

from azure.core.credentials import AzureKeyCredential
from azure.core.messaging import CloudEvent
from azure.eventgrid import EventGridConsumerClient, EventGridPublisherClient

endpoint, key, topic, sub = sys.argv[1:5]
cred = AzureKeyCredential(key)
pub = EventGridPublisherClient(endpoint, cred, namespace_topic=topic)
con = EventGridConsumerClient(endpoint, cred, namespace_topic=topic, subscription=sub)
out = {}

# A batch, then a single event.
pub.send([CloudEvent(source="/py", type="py.test", data={"n": i}, id=f"py{i}") for i in range(4)])
pub.send(CloudEvent(source="/py", type="py.test", data={"n": 4}, id="py4"))

got = con.receive(max_events=10, max_wait_time=10)
token = {d.event.id: d.broker_properties.lock_token for d in got}
out["received"] = sorted([d.event.id, d.broker_properties.delivery_count] for d in got)
out["data"] = {d.event.id: d.event.data for d in got}

out["acknowledged"] = con.acknowledge(lock_tokens=[token["py0"]]).succeeded_lock_tokens == [token["py0"]]
out["renewed"] = con.renew_locks(lock_tokens=[token["py1"]]).succeeded_lock_tokens == [token["py1"]]
out["released"] = con.release(lock_tokens=[token["py1"]]).succeeded_lock_tokens == [token["py1"]]
out["released_later"] = (
    con.release(lock_tokens=[token["py2"]], release_delay=10).succeeded_lock_tokens == [token["py2"]]
)
out["rejected"] = con.reject(lock_tokens=[token["py3"]]).succeeded_lock_tokens == [token["py3"]]

# py1 is back at once with deliveryCount 2; py2 waits out its 10 s; py3 is a dead letter; py4 is
# still locked.
again = con.receive(max_events=10, max_wait_time=10)
out["again"] = sorted([d.event.id, d.broker_properties.delivery_count] for d in again)

bad = con.acknowledge(lock_tokens=[token["py0"], "not-a-token"])
out["bad"] = sorted(f.error.code for f in bad.failed_lock_tokens)

done = con.acknowledge(lock_tokens=[d.broker_properties.lock_token for d in again] + [token["py4"]])
out["acknowledged_rest"] = len(done.succeeded_lock_tokens)
print(json.dumps(out))
