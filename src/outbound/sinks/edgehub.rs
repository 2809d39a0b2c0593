//! `endpointType: EdgeHub`: a module output on edgeHub (IoT Edge routes take it from there).
//!
//! Properties: `outputName` (required). No secrets, no endpoint health, no dead letters. The
//! sink comes from [`ModuleOutputs`], which the server plugs in under IoT Edge (the `edge`
//! module implements it); without it every attempt fails with a clear reason.

use super::{DestinationKind, ParseContext, SinkContext};
use crate::delivery::sink::{Sink, UnsupportedSink};
use crate::model::destination::{
    stored_str, Destination, DestinationError, DestinationSpec, SecretProperty,
};
use crate::model::json::Obj;
use crate::model::subscription::Subscription;
use serde_json::{json, Map, Value};
use std::sync::Arc;
use std::time::Duration;

/// Sinks for module outputs (edgeHub's MQTT connection under IoT Edge).
pub trait ModuleOutputs: Send + Sync + 'static {
    /// The sink publishing to module output `output`; each attempt waits up to `timeout` for
    /// the acknowledgement.
    fn output_sink(&self, output: &str, timeout: Duration) -> Arc<dyn Sink>;
}

/// The type.
pub struct EdgeHub;

/// A parsed EdgeHub destination.
#[derive(Debug)]
pub struct EdgeHubDestination {
    /// Output name.
    pub output_name: String,
}

impl DestinationSpec for EdgeHubDestination {
    fn echo(&self, props: &mut Map<String, Value>) {
        props.insert("outputName".into(), json!(self.output_name));
    }
    fn secrets(&self) -> &'static [SecretProperty] {
        &[]
    }
}

impl DestinationKind for EdgeHub {
    fn names(&self) -> &'static [&'static str] {
        &["EdgeHub"]
    }

    fn parse(
        &self,
        props: &Obj<'_>,
        ctx: &ParseContext<'_>,
    ) -> Result<Destination, DestinationError> {
        let out = ctx.required_for(props, "outputname", "outputName", "EdgeHub")?;
        Ok(Destination::new(
            "EdgeHub",
            EdgeHubDestination {
                output_name: out.to_string(),
            },
        ))
    }

    fn restore(&self, props: &Map<String, Value>) -> Result<Destination, String> {
        Ok(Destination::new(
            "EdgeHub",
            EdgeHubDestination {
                output_name: stored_str(props, "outputName")?.to_string(),
            },
        ))
    }

    fn sink(&self, sub: &Subscription, ctx: &SinkContext) -> Arc<dyn Sink> {
        let Some(d) = sub.destination.spec::<EdgeHubDestination>() else {
            return super::mismatched("EdgeHub");
        };
        match &ctx.module_outputs {
            Some((outputs, timeout)) => outputs.output_sink(&d.output_name, *timeout),
            None => Arc::new(UnsupportedSink(
                "EdgeHub destinations need the IoT Edge runtime (IOTEDGE_WORKLOADURI)".into(),
            )),
        }
    }

    fn example(&self, _base: &str) -> Value {
        json!({ "outputName": "route-out" })
    }
}
