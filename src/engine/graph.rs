use super::EngineError;
use serde_json::json;
use std::collections::HashSet;

/// The virtual entry node (10xGraph's `START`).
pub const START: &str = "__start__";
/// The virtual exit node (10xGraph's `END`): routing there completes the run.
pub const END: &str = "__end__";

/// One edge of the topology: fixed, or one answer of a condition.
#[derive(Debug, Clone, PartialEq)]
pub struct EdgeSpec {
    /// The node the edge leaves.
    pub from: String,
    /// Empty for a conditional edge without a path map (the condition names the target).
    pub to: String,
    /// Index of the condition in the host's table.
    pub condition: Option<usize>,
    /// The path-map key this edge answers to.
    pub condition_result: Option<String>,
}

impl EdgeSpec {
    /// An unconditional edge.
    pub fn fixed(from: &str, to: &str) -> Self {
        EdgeSpec { from: from.into(), to: to.into(), condition: None, condition_result: None }
    }
}

/// The compiled topology. Node bodies live in the host; the engine knows only their names.
#[derive(Debug, Clone, Default)]
pub struct GraphSpec {
    /// Node names, without `START` and `END`.
    pub nodes: Vec<String>,
    /// Every edge, in the order they were added (the first fixed edge of a node wins).
    pub edges: Vec<EdgeSpec>,
    /// The first node (`set_entry_point` or `add_edge(START, node)`).
    pub entry: Option<String>,
    /// Nodes the run pauses before.
    pub interrupt_before: Vec<String>,
    /// Nodes the run pauses after (their step committed).
    pub interrupt_after: Vec<String>,
    /// Nodes run by the replay-safe tool handler instead of `NodeHost::run_node`.
    pub tool_nodes: Vec<String>,
    /// The state a new thread starts from holds messages (a system prompt in the prototype):
    /// a first input without messages has something to run on, as in 10xGraph.
    pub starts_with_messages: bool,
}

impl GraphSpec {
    /// START has a conditional edge: a turn's first node is routed, not the fixed entry.
    pub fn routes_out_of_start(&self) -> bool {
        self.edges.iter().any(|e| e.from == START && e.condition.is_some())
    }

    /// `interrupt_before` names `node`.
    pub fn pauses_before(&self, node: &str) -> bool {
        self.interrupt_before.iter().any(|n| n == node)
    }

    /// `interrupt_after` names `node`.
    pub fn pauses_after(&self, node: &str) -> bool {
        self.interrupt_after.iter().any(|n| n == node)
    }

    /// Whether `name` is a node of the graph (`START` and `END` included).
    pub fn has_node(&self, name: &str) -> bool {
        name == START || name == END || self.nodes.iter().any(|n| n == name)
    }

    /// The checks 10xGraph's `compile` makes, with its codes.
    pub fn validate(&self) -> Result<(), EngineError> {
        let Some(entry) = &self.entry else {
            return Err(EngineError::graph(
                "GRAPH_002",
                "No entry point set. Use set_entry_point() or add_edge(START, node).",
                json!({}),
            ));
        };
        if !self.has_node(entry) {
            return Err(EngineError::graph(
                "GRAPH_004",
                format!("Entry point '{entry}' is not a node"),
                json!({"node": entry}),
            ));
        }
        let mut connected: HashSet<&str> = HashSet::new();
        for e in &self.edges {
            connected.insert(&e.from);
            if !e.to.is_empty() {
                connected.insert(&e.to);
            }
        }
        let orphans: Vec<&String> = self.nodes.iter().filter(|n| !connected.contains(n.as_str())).collect();
        if !orphans.is_empty() {
            return Err(EngineError::graph(
                "GRAPH_003",
                format!("Orphaned nodes found: {orphans:?}"),
                json!({"orphaned_nodes": orphans}),
            ));
        }
        for e in &self.edges {
            for end in [&e.from, &e.to] {
                if !end.is_empty() && !self.has_node(end) {
                    return Err(EngineError::graph(
                        "GRAPH_004",
                        format!("Edge {} -> {} refers to a node that does not exist: '{end}'", e.from, e.to),
                        json!({"from_node": e.from, "to_node": e.to}),
                    ));
                }
            }
        }
        // Two fixed edges out of one node: the loop follows the first and the other branch never
        // ran, without a word (10xGraph the same). There are no parallel branches to run.
        let mut fixed: std::collections::HashMap<&str, &str> = std::collections::HashMap::new();
        for e in self.edges.iter().filter(|e| e.condition.is_none()) {
            match fixed.insert(&e.from, &e.to) {
                Some(first) if first != e.to => {
                    return Err(EngineError::graph(
                        "GRAPH_005",
                        format!(
                            "Node '{}' has two fixed edges ('{first}' and '{}'); a node has one next node (use a \
                             conditional edge to choose between them)",
                            e.from, e.to
                        ),
                        json!({"node": e.from, "targets": [first, e.to]}),
                    ));
                }
                _ => {}
            }
        }
        // START and END are 10xGraph's nodes too: a pause before or after START gates every turn
        // (see run_loop/start.rs); END never runs, so its pauses never fire, as in 10xGraph.
        for n in self.interrupt_before.iter().chain(&self.interrupt_after) {
            if !self.has_node(n) {
                return Err(EngineError::graph(
                    "GRAPH_004",
                    format!("Interrupt node '{n}' does not exist"),
                    json!({"node": n}),
                ));
            }
        }
        Ok(())
    }
}
