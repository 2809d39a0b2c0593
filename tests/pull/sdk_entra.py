"""Microsoft Entra ID tokens with Microsoft's Python SDK (azure-eventgrid), unmodified.

Usage: sdk_entra.py ENDPOINT TOPIC SUBSCRIPTION SENDER_TOKEN RECEIVER_TOKEN EXPIRED_TOKEN.
Each client gets a token credential: any object with get_token(*scopes, **kw) returning an
AccessToken, as DefaultAzureCredential is. Here it returns a token the Rust test signed locally.
The SDK sends it as `Authorization: Bearer`; azure-core sends bearer tokens over https only, so
ENDPOINT is gridlet's https listener and REQUESTS_CA_BUNDLE names its self-signed certificate.
Prints what it saw as one JSON object for tests/it/entra.rs.
"""
import json
import sys
import time

from azure.core.credentials import AccessToken
from azure.core.exceptions import ClientAuthenticationError, HttpResponseError
from azure.core.messaging import CloudEvent
from azure.eventgrid import EventGridConsumerClient, EventGridPublisherClient

endpoint, topic, sub, sender, receiver, expired = sys.argv[1:7]


class LocalToken:
    """A token credential returning one fixed token, recording the scopes it was asked for."""

    def __init__(self, token):
        self.token = token
        self.scopes = []

    def get_token(self, *scopes, **kwargs):
        self.scopes.extend(scopes)
        return AccessToken(self.token, int(time.time()) + 3600)


out = {}
send_cred = LocalToken(sender)
pub = EventGridPublisherClient(endpoint, send_cred, namespace_topic=topic)
pub.send([CloudEvent(source="/py", type="py.entra", data={"n": i}, id=f"e{i}") for i in range(2)])
out["scopes"] = sorted(set(send_cred.scopes))

con = EventGridConsumerClient(endpoint, LocalToken(receiver), namespace_topic=topic, subscription=sub)
got = con.receive(max_events=10, max_wait_time=10)
out["received"] = sorted(d.event.id for d in got)
done = con.acknowledge(lock_tokens=[d.broker_properties.lock_token for d in got])
out["acknowledged"] = len(done.succeeded_lock_tokens)

# The receiver may not publish; the sender may not receive; an expired token gets 401.
def status(f):
    try:
        f()
        return 200
    except ClientAuthenticationError as e:
        return e.status_code
    except HttpResponseError as e:
        return e.status_code


wrong = EventGridPublisherClient(endpoint, LocalToken(receiver), namespace_topic=topic)
out["receiver_publishes"] = status(lambda: wrong.send(CloudEvent(source="/py", type="t", data=1)))
thief = EventGridConsumerClient(endpoint, LocalToken(sender), namespace_topic=topic, subscription=sub)
out["sender_receives"] = status(lambda: thief.receive(max_events=1, max_wait_time=1))
old = EventGridPublisherClient(endpoint, LocalToken(expired), namespace_topic=topic)
out["expired_publishes"] = status(lambda: old.send(CloudEvent(source="/py", type="t", data=1)))
print(json.dumps(out))
