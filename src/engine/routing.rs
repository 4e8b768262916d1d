use super::{BoxError, EdgeSpec, EngineError, RouteValue, graph::END};
use serde_json::json;

/// 10xGraph's `get_next_node`: conditional edges in insertion order (the condition is called once
/// per conditional edge, as upstream does), then the first static edge, then END.
pub fn next_node(
    current: &str,
    edges: &[EdgeSpec],
    mut eval: impl FnMut(usize) -> Result<RouteValue, BoxError>,
) -> Result<String, EngineError> {
    let outgoing: Vec<&EdgeSpec> = edges.iter().filter(|e| e.from == current).collect();
    for e in outgoing.iter().filter(|e| e.condition.is_some()) {
        let idx = e.condition.expect("filtered on is_some");
        let result = eval(idx).map_err(|cause| EngineError::Graph {
            code: "GRAPH_ROUTING_001",
            message: format!("Routing condition from '{current}' failed: {cause}"),
            context: json!({"from_node": current, "to_node": e.to, "error_type": error_type(&*cause)}),
            cause: Some(cause),
        })?;
        match (&e.condition_result, result) {
            (Some(key), RouteValue::Str(s)) if *key == s => return Ok(e.to.clone()),
            (Some(_), _) => continue,
            (None, RouteValue::Str(s)) => return Ok(s),
            (None, RouteValue::Truthy(true)) => return Ok(e.to.clone()),
            (None, RouteValue::Truthy(false)) => continue,
        }
    }
    Ok(outgoing.iter().find(|e| e.condition.is_none()).map(|e| e.to.clone()).unwrap_or_else(|| END.to_owned()))
}

fn error_type(e: &(dyn std::error::Error + Send + Sync)) -> String {
    // The host's error Display starts with the Python class name ("ValueError: ...").
    let s = e.to_string();
    s.split(':').next().unwrap_or("Exception").trim().to_owned()
}
