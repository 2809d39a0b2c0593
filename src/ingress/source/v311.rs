//! The driver of an MQTT 3.1.1 connection (`protocolVersion=3.1.1`, for brokers without 5): the
//! MQTT 5 driver's loop with 3.1.1's packets. No properties: payloads are `data_base64`, routes
//! are found by matching filters, and the session is kept by `cleanStart=false` alone (the
//! broker decides how long).

use super::{Ack, Backoff, Handover, Message, Received, Source};
use rumqttc::{Event, EventLoop, Packet, QoS, SubscribeReasonCode};
use tokio::sync::mpsc;

impl Source {
    pub(super) async fn drive_v311(&self, mut el: EventLoop, tx: mpsc::Sender<Received>) {
        let mut backoff = Backoff::reconnect(self.name());
        let mut awaiting_subacks = 0usize;
        let mut held = Handover::new(usize::from(self.spec.receive_maximum));
        let mut checked = false;
        loop {
            match held.pass_on(&tx) {
                Err(()) => return,
                Ok(true) => {
                    tracing::warn!(connection = %self.name(), "MQTT broker sent more messages than gridlet holds; reconnecting so it resends what was set aside");
                    self.forget_session_v311(&mut el);
                }
                Ok(false) => {}
            }
            if !checked {
                checked = self.address_allowed(&mut backoff).await;
                continue;
            }
            match el.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(ack))) => {
                    awaiting_subacks = self.on_connack(ack.session_present, &mut backoff);
                }
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    let message = Message {
                        topic: p.topic.clone(),
                        payload: p.payload.clone(),
                        ..Message::default()
                    };
                    let ack = (p.qos != QoS::AtMostOnce).then_some(Ack::V311(p));
                    self.on_publish(message, ack, &tx, &mut held);
                }
                Ok(Event::Incoming(Packet::SubAck(ack))) => {
                    let refused = ack
                        .return_codes
                        .iter()
                        .filter(|c| matches!(c, SubscribeReasonCode::Failure));
                    self.on_suback(&mut awaiting_subacks, refused.map(|c| format!("{c:?}")));
                }
                Ok(Event::Incoming(Packet::UnsubAck(_))) => {
                    self.on_suback(&mut awaiting_subacks, std::iter::empty());
                }
                Ok(_) => {}
                Err(e) => {
                    checked = false;
                    self.forget_session_v311(&mut el);
                    held.clear();
                    self.on_connection_error(e.to_string());
                    tokio::time::sleep(backoff.next_delay()).await;
                }
            }
        }
    }

    fn forget_session_v311(&self, el: &mut EventLoop) {
        self.forget(|| {
            el.clean();
            el.pending
                .retain(|r| !matches!(r, rumqttc::Request::PubAck(_)));
        });
    }
}
