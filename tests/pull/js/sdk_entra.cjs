// Microsoft Entra ID tokens and namespace filters with Microsoft's JavaScript SDK
// (@azure/eventgrid-namespaces), unmodified. Usage: node sdk_entra.cjs ENDPOINT TOPIC
// SENDER_TOKEN RECEIVER_TOKEN EXPIRED_TOKEN SUBSCRIPTION... Each client gets a TokenCredential:
// any object with getToken(scopes, options) resolving to { token, expiresOnTimestamp }, as
// DefaultAzureCredential is. Here it returns a token the Rust test signed locally. The SDK sends
// it as `Authorization: Bearer`, over https only (core-rest-pipeline refuses http), so ENDPOINT
// is gridlet's https listener and NODE_EXTRA_CA_CERTS names its self-signed certificate. Prints
// what it saw as one JSON object for tests/it/pull_sdk.rs.
const { EventGridSenderClient, EventGridReceiverClient } = require("@azure/eventgrid-namespaces");

/** A token credential returning one fixed token, recording the scopes it was asked for. */
function localToken(token) {
  const cred = {
    scopes: [],
    async getToken(scopes) {
      cred.scopes.push(...(Array.isArray(scopes) ? scopes : [scopes]));
      return { token, expiresOnTimestamp: Date.now() + 3600 * 1000 };
    },
  };
  return cred;
}

/** The HTTP status a call fails with, or 200. */
async function status(f) {
  try {
    await f();
    return 200;
  } catch (e) {
    return e.statusCode;
  }
}

async function main() {
  const [endpoint, topic, senderToken, receiverToken, expiredToken, ...subs] = process.argv.slice(2);
  const options = { retryOptions: { maxRetries: 0 } };
  const out = {};
  const sendCred = localToken(senderToken);
  const sender = new EventGridSenderClient(endpoint, sendCred, topic, options);
  // What the subscriptions' filters sort (tests/it/pull_sdk.rs lists which each must get).
  const events = [
    ["e0", "js.entra", { n: 0, s: "edge-0" }],
    ["e1", "js.entra", { n: 1, s: "IotHub-1" }],
    ["e2", "js.entra", { n: 2, s: "edge-2" }],
    ["e3", "js.other", { n: 3, s: "edge-3" }],
  ].map(([id, type, data]) => ({ type, source: "/js", id, specversion: "1.0", data }));
  await sender.sendEvents(events.slice(0, 3));
  await sender.sendEvents(events[3]);
  out.scopes = [...new Set(sendCred.scopes)].sort();

  const receiverCred = localToken(receiverToken);
  for (const sub of subs) {
    const receiver = new EventGridReceiverClient(endpoint, receiverCred, topic, sub, options);
    const got = await receiver.receiveEvents({ maxEvents: 10, maxWaitTime: 2 });
    out[sub] = got.details.map((d) => d.event.id).sort();
    const tokens = got.details.map((d) => d.brokerProperties.lockToken);
    if (tokens.length > 0) {
      const done = await receiver.acknowledgeEvents(tokens);
      out[`${sub}_acknowledged`] = done.succeededLockTokens.length;
    }
  }

  // The receiver may not publish; the sender may not receive; an expired token gets 401.
  const wrong = new EventGridSenderClient(endpoint, localToken(receiverToken), topic, options);
  const one = { type: "t", source: "/js", id: "x", specversion: "1.0", data: 1 };
  out.receiver_publishes = await status(() => wrong.sendEvents(one));
  const thief = new EventGridReceiverClient(endpoint, localToken(senderToken), topic, subs[0], options);
  out.sender_receives = await status(() => thief.receiveEvents({ maxEvents: 1, maxWaitTime: 1 }));
  const old = new EventGridSenderClient(endpoint, localToken(expiredToken), topic, options);
  out.expired_publishes = await status(() => old.sendEvents(one));
  console.log(JSON.stringify(out));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
