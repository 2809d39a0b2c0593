//! The acceptor: takes what the driver handed over (up to the receive maximum) as one batch,
//! makes each message's events, publishes them per gridlet topic through [`Broker::publish`]
//! (one commit for the batch), holds the batch with back-off while gridlet cannot take it, and
//! only then acknowledges the QoS 1 messages of the current session, in arrival order.

use super::trace::BatchTrace;
use super::{Ack, Client, Received, Source};
use crate::broker::BrokerError;
use crate::ingress::message::{self, Envelope, Message};
use crate::ingress::route;
use crate::model::event::IncomingEvent;
use crate::outbound::mqtt::connection::Backoff;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Shortest and longest wait before a held batch is offered again.
const HOLD_MIN: Duration = Duration::from_millis(100);
const HOLD_MAX: Duration = Duration::from_secs(5);

/// One event to publish: which message of the batch, through which route, under which id
/// (kept across offers, so a held event keeps its id).
struct Item {
    message: usize,
    route: usize,
    id: String,
}

impl Source {
    pub(super) async fn accept(self: Arc<Self>, mut rx: mpsc::Receiver<Received>) {
        let max = usize::from(self.spec.receive_maximum).max(1);
        let mut batch = Vec::with_capacity(max);
        loop {
            if rx.recv_many(&mut batch, max).await == 0 {
                return;
            }
            tracing::debug!(connection = %self.name(), messages = batch.len(), "MQTT batch");
            self.accept_batch(&mut batch).await;
            self.acknowledge(&batch).await;
            tracing::debug!(connection = %self.name(), messages = batch.len(), "MQTT batch accepted and acknowledged");
            batch.clear();
        }
    }

    /// The routes `m` goes to: those the broker named (subscription identifiers), else those
    /// whose filter matches its topic. A named route must match the topic too: a message the
    /// broker sends again after the routes changed (resent on a new session) carries the
    /// identifier of the session it was first sent on, which may now number another route.
    fn routes_of(&self, m: &Message) -> Vec<usize> {
        let named: Vec<usize> = m
            .subscription_ids
            .iter()
            .filter_map(|id| id.checked_sub(1))
            .filter(|i| {
                self.routes
                    .get(*i)
                    .is_some_and(|r| route::matches(&r.filter, &m.topic))
            })
            .collect();
        if !named.is_empty() {
            return named;
        }
        (0..self.routes.len())
            .filter(|i| route::matches(&self.routes[*i].filter, &m.topic))
            .collect()
    }

    /// Publish the batch's events, per gridlet topic, until all are accepted (or refused for
    /// good); QoS 0 messages are dropped when they cannot be accepted at once.
    async fn accept_batch(&self, batch: &mut [Received]) {
        // Per gridlet topic, its events in arrival order.
        let mut groups: Vec<(String, Vec<Item>)> = Vec::new();
        for (mi, r) in batch.iter().enumerate() {
            let routes = self.routes_of(&r.message);
            if routes.is_empty() {
                self.status.refused.inc();
                tracing::debug!(connection = %self.name(), topic = %r.message.topic, "MQTT message matches no route");
                continue;
            }
            for ri in routes {
                let topic = &self.routes[ri].topic;
                let item = Item {
                    message: mi,
                    route: ri,
                    id: message::new_id(),
                };
                match groups.iter_mut().find(|(t, _)| t == topic) {
                    Some((_, items)) => items.push(item),
                    None => groups.push((topic.clone(), vec![item])),
                }
            }
        }
        let time = crate::store::deadletter::rfc3339(crate::clock::system_wall_ms());
        let mut hold = Backoff::new(HOLD_MIN, HOLD_MAX, u64::from(batch.len() as u32));
        for (topic, mut items) in groups {
            // Published in chunks; a chunk gridlet cannot take now is halved before it is
            // offered again, so a batch larger than what the disk bound leaves still goes in.
            let mut chunk = items.len();
            let mut warned = false;
            while !items.is_empty() {
                let mut part: Vec<_> = items.drain(..chunk.min(items.len())).collect();
                match self.publish(&topic, &mut part, batch, &time).await {
                    Ok(()) => hold.reset(),
                    Err(e) => {
                        // Held: QoS 0 messages go, the rest waits and is offered again.
                        part.retain(|it| {
                            let keep = batch[it.message].publish.is_some();
                            if !keep {
                                self.status.dropped.inc();
                            }
                            keep
                        });
                        items.splice(0..0, part);
                        chunk = (chunk / 2).max(1);
                        self.status.paused.store(1, Relaxed);
                        self.status.set_error(e.to_string());
                        if !warned {
                            warned = true;
                            tracing::warn!(connection = %self.name(), %topic, error = %e, "MQTT messages held (not acknowledged) until gridlet can accept them");
                        }
                        if !items.is_empty() {
                            tokio::time::sleep(hold.next_delay()).await;
                        }
                    }
                }
            }
        }
        self.status.paused.store(0, Relaxed);
    }

    /// One publish of `items` to `topic`. Items whose message makes no valid event are refused
    /// (removed, counted, logged). An error means nothing was accepted.
    async fn publish(
        &self,
        topic: &str,
        items: &mut Vec<Item>,
        batch: &[Received],
        time: &str,
    ) -> Result<(), BrokerError> {
        let entry = self.broker.find_topic(topic)?;
        let t = entry.topic();
        let mut events: Vec<IncomingEvent> = Vec::with_capacity(items.len());
        let mut refused = Vec::new();
        for (k, it) in items.iter().enumerate() {
            let env = Envelope {
                schema: t.input_schema,
                topic: &t.name,
                source: self.name(),
                id: it.id.clone(),
                time,
                enrichments: &self.routes[it.route].enrichments,
            };
            let m = &batch[it.message].message;
            match message::to_event(m, &env) {
                Ok(ev) => events.push(ev),
                Err(e) => {
                    tracing::warn!(connection = %self.name(), mqtt_topic = %m.topic, %topic, error = %e, "MQTT message refused: it makes no valid event");
                    self.status
                        .set_error(format!("message on {} refused: {e}", m.topic));
                    refused.push(k);
                }
            }
        }
        for k in refused.into_iter().rev() {
            items.remove(k);
            self.status.refused.inc();
        }
        if events.is_empty() {
            return Ok(());
        }
        let trace = BatchTrace::start(self.broker.tracer(), &mut events);
        let result = self.broker.publish(&entry, events, trace.span()).await;
        trace.finish(self.name(), topic, &result);
        result
    }

    /// Acknowledge the batch's QoS 1 messages of the current session, in order.
    async fn acknowledge(&self, batch: &[Received]) {
        for r in batch {
            let Some(p) = &r.publish else { continue };
            loop {
                let sent = {
                    let g = self.generation.lock();
                    if *g != r.generation || *g == 0 {
                        // The broker resends it on the new session.
                        break;
                    }
                    match (&self.client, p) {
                        (Client::V5(c), Ack::V5(p)) => c.try_ack(p).map_err(drop),
                        (Client::V311(c), Ack::V311(p)) => c.try_ack(p).map_err(drop),
                        _ => Ok(()),
                    }
                };
                match sent {
                    Ok(()) => {
                        self.status.acknowledged.inc();
                        break;
                    }
                    // rumqttc's request queue is full: let the driver drain it.
                    Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
                }
            }
        }
    }
}
