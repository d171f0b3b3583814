//! Kubernetes Events on the pod whose slice the agent refused, found tampered with, found
//! over its slice, or found over its SM share (`--kube-events`): what `kubectl describe pod` and `kubectl get events` show
//! the pod's owner, beside the log, the metrics and the D-Bus signals.
//!
//! Events go through kube's `Recorder` (events.k8s.io/v1; a repeat of the same event on the
//! same pod within minutes becomes a series with a count, not a new object). Posting never
//! holds up the agent: [`EventSink::post`] queues without waiting, a task posts, and what does
//! not fit the queue or fails to post is logged and dropped.

use gpuslice_core::pod::PodRef;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc;

/// Events waiting to be posted; more are dropped.
const QUEUE: usize = 256;
/// The `reportingController` of every event.
pub const CONTROLLER: &str = "gpuslice.io/agent";

/// What happened to a pod's slice.
#[derive(Debug, Clone, PartialEq)]
pub enum Happening {
    /// The agent refused the slice: `why` is the refusal the runtime also reports.
    Refused { container: String, why: String },
    /// The container's usage region was tampered with.
    Tampered { container: String, why: String },
    /// The driver showed the container over its slice; `action` is what the agent did.
    OverLimit {
        container: String,
        gpu: String,
        used: u64,
        limit: u64,
        action: String,
    },
    /// The container's processes kept GPU `gpu` busier than its SM share, its tolerance and
    /// its burst, by `over` seconds of the GPU's time; `action` is what the agent did.
    OverShare {
        container: String,
        gpu: String,
        share: f64,
        over: f64,
        action: String,
    },
}

impl Happening {
    /// The event's reason, action and note.
    fn event(&self) -> Event {
        let (reason, action, note) = match self {
            Happening::Refused { container, why } => (
                "GPUSliceRefused",
                "Admit",
                format!("container {container}: {why}"),
            ),
            Happening::Tampered { container, why } => (
                "GPUSliceTampered",
                "Enforce",
                format!("container {container}: usage region tampered with: {why}"),
            ),
            Happening::OverLimit {
                container,
                gpu,
                used,
                limit,
                action,
            } => (
                "GPUSliceOverLimit",
                "Enforce",
                format!(
                    "container {container}: the driver shows {used} bytes on {gpu}, over its slice of {limit}; action: {action}"
                ),
            ),
            Happening::OverShare {
                container,
                gpu,
                share,
                over,
                action,
            } => (
                "GPUSliceOverShare",
                "Enforce",
                format!(
                    "container {container}: its processes kept {gpu} busier than {:.0}% of its time (its SM share and the tolerance) by {over:.2} s beyond its burst; action: {action}",
                    share * 100.0
                ),
            ),
        };
        Event {
            type_: EventType::Warning,
            reason: reason.to_string(),
            // The API server refuses notes over 1 kB.
            note: Some(truncate(note, 1000)),
            action: action.to_string(),
            secondary: None,
        }
    }
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// How an event names a container: by its name in the pod, else by its id.
pub fn container_name(pod: Option<&PodRef>, id: &str) -> String {
    pod.map(|p| p.container.as_str())
        .filter(|c| !c.is_empty())
        .unwrap_or(id)
        .to_string()
}

/// The pod as the Events API names what an event is about.
pub fn object_reference(pod: &PodRef) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(pod.namespace.clone()),
        name: Some(pod.name.clone()),
        uid: (!pod.uid.is_empty()).then(|| pod.uid.clone()),
        ..ObjectReference::default()
    }
}

/// Where events go: nowhere (not on Kubernetes, or `--kube-events` not given) or a posting
/// task.
#[derive(Debug, Clone, Default)]
pub struct EventSink {
    queue: Option<mpsc::Sender<(PodRef, Happening)>>,
}

impl EventSink {
    /// Starts the task that posts events through `client`, as the agent of `node`. Needs a
    /// Tokio runtime.
    pub fn start(client: kube::Client, node: &str) -> Self {
        let (tx, mut rx) = mpsc::channel::<(PodRef, Happening)>(QUEUE);
        let recorder = Recorder::new(
            client,
            Reporter {
                controller: CONTROLLER.to_string(),
                instance: Some(node.to_string()),
            },
        );
        tokio::spawn(async move {
            while let Some((pod, happening)) = rx.recv().await {
                let reference = object_reference(&pod);
                if let Err(e) = recorder.publish(&happening.event(), &reference).await {
                    tracing::warn!(pod = %format!("{}/{}", pod.namespace, pod.name), "failed to post a Kubernetes Event: {e}");
                }
            }
        });
        Self { queue: Some(tx) }
    }

    /// Queues an event on `pod`, if there is one and events are posted; never waits.
    pub fn post(&self, pod: Option<&PodRef>, happening: Happening) {
        let (Some(queue), Some(pod)) = (&self.queue, pod) else {
            return;
        };
        if queue.try_send((pod.clone(), happening)).is_err() {
            tracing::warn!(pod = %format!("{}/{}", pod.namespace, pod.name), "Kubernetes Event dropped: the queue is full");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_happening_is_a_warning_with_its_reason_and_the_container_in_its_note() {
        let refused = Happening::Refused {
            container: "model".into(),
            why: "GPU 0 has 1Gi free, 4Gi asked".into(),
        }
        .event();
        assert_eq!(refused.type_, EventType::Warning);
        assert_eq!(refused.reason, "GPUSliceRefused");
        assert_eq!(
            refused.note.as_deref(),
            Some("container model: GPU 0 has 1Gi free, 4Gi asked")
        );
        let over = Happening::OverLimit {
            container: "c".into(),
            gpu: "GPU-1".into(),
            used: 5,
            limit: 4,
            action: "kill".into(),
        }
        .event();
        assert_eq!(
            (over.reason.as_str(), over.action.as_str()),
            ("GPUSliceOverLimit", "Enforce")
        );
    }

    #[test]
    fn a_note_is_cut_to_what_the_api_server_takes_on_a_character_boundary() {
        let long = Happening::Tampered {
            container: "c".into(),
            why: "é".repeat(800),
        }
        .event();
        let note = long.note.unwrap();
        assert!(note.len() <= 1000 && note.len() > 990, "{}", note.len());
    }

    #[test]
    fn without_a_pod_or_a_posting_task_nothing_is_queued() {
        let sink = EventSink::default();
        sink.post(
            Some(&PodRef {
                namespace: "a".into(),
                name: "b".into(),
                uid: String::new(),
                container: String::new(),
            }),
            Happening::Refused {
                container: "c".into(),
                why: "w".into(),
            },
        );
        let (tx, mut rx) = mpsc::channel(1);
        let sink = EventSink { queue: Some(tx) };
        sink.post(
            None,
            Happening::Refused {
                container: "c".into(),
                why: "w".into(),
            },
        );
        assert!(rx.try_recv().is_err());
    }
}
