// Pull delivery with Microsoft's JavaScript SDK (@azure/eventgrid-namespaces), unmodified,
// against gridlet. Usage: node sdk_pull.cjs ENDPOINT KEY TOPIC SUBSCRIPTION (NODE_PATH names
// the node_modules that scripts/test.sh installs from package-lock.json). Prints one JSON object
// for tests/it/pull_sdk.rs to check.
const { AzureKeyCredential, EventGridSenderClient, EventGridReceiverClient } = require("@azure/eventgrid-namespaces");

async function main() {
  const [endpoint, key, topic, sub] = process.argv.slice(2);
  const cred = new AzureKeyCredential(key);
  const options = { allowInsecureConnection: true, retryOptions: { maxRetries: 0 } };
  const sender = new EventGridSenderClient(endpoint, cred, topic, options);
  const receiver = new EventGridReceiverClient(endpoint, cred, topic, sub, options);
  const out = {};
  const ev = (i) => ({ type: "js.test", source: "/js", id: `js${i}`, specversion: "1.0", data: { n: i } });
  await sender.sendEvents([ev(0), ev(1), ev(2), ev(3)]);
  await sender.sendEvents(ev(4));

  const got = await receiver.receiveEvents({ maxEvents: 10, maxWaitTime: 10 });
  const token = {};
  for (const d of got.details) token[d.event.id] = d.brokerProperties.lockToken;
  out.received = got.details.map((d) => [d.event.id, d.brokerProperties.deliveryCount]).sort();
  out.data = Object.fromEntries(got.details.map((d) => [d.event.id, d.event.data]));

  const ok = (r, t) => r.succeededLockTokens.length === 1 && r.succeededLockTokens[0] === t;
  out.acknowledged = ok(await receiver.acknowledgeEvents([token.js0]), token.js0);
  out.renewed = ok(await receiver.renewEventLocks([token.js1]), token.js1);
  out.released = ok(await receiver.releaseEvents([token.js1]), token.js1);
  out.released_later = ok(await receiver.releaseEvents([token.js2], { releaseDelay: "10" }), token.js2);
  out.rejected = ok(await receiver.rejectEvents([token.js3]), token.js3);

  const again = await receiver.receiveEvents({ maxEvents: 10, maxWaitTime: 10 });
  out.again = again.details.map((d) => [d.event.id, d.brokerProperties.deliveryCount]).sort();

  const bad = await receiver.acknowledgeEvents([token.js0, "not-a-token"]);
  out.bad = bad.failedLockTokens.map((f) => f.error.code).sort();

  const rest = again.details.map((d) => d.brokerProperties.lockToken).concat([token.js4]);
  out.acknowledged_rest = (await receiver.acknowledgeEvents(rest)).succeededLockTokens.length;
  console.log(JSON.stringify(out));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
