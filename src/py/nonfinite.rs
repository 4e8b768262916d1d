//! Finds a NaN or infinite float anywhere in a Python value before it is dumped to JSON.
//!
//! pydantic-core has no single answer for such a float: a field typed `float` (in the model,
//! a nested model, a dataclass, a `list[float]`) is written as `null` whatever the serializer's
//! config says, because a model instance is written by its own class's prebuilt serializer, while
//! a value typed `Any` follows the config. A `null` stored in place of the float is a silent change
//! (the caller still holds the float), so the stored forms (`tenxgraph._state_codec`) look first,
//! here, and refuse such a value by name. Walked in Rust: a message is some fifty objects, and the
//! walk runs for every message and state a run stores.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyFloat, PyFrozenSet, PyInt, PyList, PySet, PyString, PyTuple, PyType};
use std::collections::HashSet;
use std::hash::{BuildHasherDefault, Hasher};

/// Deeper than any document the engine stores (its JSON parser stops at 128 levels): past this,
/// values are not looked into, and the engine's own depth check answers for them.
const MAX_DEPTH: usize = 256;

enum Seg<'py> {
    Root,
    Key(Bound<'py, PyAny>),
    /// A field of a pydantic model: (the model, the field's name).
    Field(Bound<'py, PyAny>, Bound<'py, PyAny>),
    Index(usize),
}

/// The path (`"blob.x"`, `"metadata.scores[1]"`) and the text of the first NaN or infinity
/// found in `value`, or None. Looks into dicts, lists, tuples, sets, pydantic models (their
/// fields and extras) and dataclasses; a top-level field named `skip` is left out (a step stores
/// a state's `context` as message rows, each walked on its own), and so is a value under a model
/// field declared `exclude=True`, which no dump writes (checked only for a find: it is rare).
pub(super) fn find<'py>(py: Python<'py>, value: &Bound<'py, PyAny>, skip: Option<&str>) -> PyResult<Option<(String, String)>> {
    let base_model = base_model(py)?;
    // Each entry: where a value sits (parent entry, segment), read back only to name a find.
    let mut trail: Vec<(usize, Seg<'py>)> = vec![(0, Seg::Root)];
    let mut stack: Vec<(Bound<'py, PyAny>, usize, usize)> = vec![(value.clone(), 0, 0)];
    // Containers already walked (shared or cyclic ones are walked once), by address.
    let mut seen: HashSet<usize, BuildHasherDefault<AddrHasher>> = HashSet::default();
    while let Some((v, depth, at)) = stack.pop() {
        if let Ok(f) = v.cast::<PyFloat>() {
            let x = f.value();
            if !x.is_finite() && !excluded(py, &trail, at)? {
                return Ok(Some((path(&trail, at), format!("{x}"))));
            }
            continue;
        }
        if depth >= MAX_DEPTH || is_leaf(&v) || v.is_instance_of::<PyBytes>() {
            continue;
        }
        // Strings, ints and None (most of a message) get no trail entry and no stack slot.
        let mut push = |child: Bound<'py, PyAny>, seg: Seg<'py>, stack: &mut Vec<_>| {
            trail.push((at, seg));
            stack.push((child, depth + 1, trail.len() - 1));
        };
        let top = depth == 0;
        if let Ok(d) = v.cast::<PyDict>() {
            if !seen.insert(v.as_ptr() as usize) {
                continue;
            }
            for (k, child) in d.iter() {
                if !is_leaf(&child) {
                    push(child, Seg::Key(k), &mut stack);
                }
            }
        } else if let Ok(l) = v.cast::<PyList>() {
            if !seen.insert(v.as_ptr() as usize) {
                continue;
            }
            for (i, child) in l.iter().enumerate() {
                if !is_leaf(&child) {
                    push(child, Seg::Index(i), &mut stack);
                }
            }
        } else if let Ok(t) = v.cast::<PyTuple>() {
            for (i, child) in t.iter().enumerate() {
                if !is_leaf(&child) {
                    push(child, Seg::Index(i), &mut stack);
                }
            }
        } else if v.is_instance_of::<PySet>() || v.is_instance_of::<PyFrozenSet>() {
            for (i, child) in v.try_iter()?.enumerate() {
                let child = child?;
                if !is_leaf(&child) {
                    push(child, Seg::Index(i), &mut stack);
                }
            }
        } else if is_model(&v, base_model) {
            if !seen.insert(v.as_ptr() as usize) {
                continue;
            }
            if let Ok(fields) = v.getattr(pyo3::intern!(py, "__dict__"))
                && let Ok(fields) = fields.cast::<PyDict>()
            {
                for (k, child) in fields.iter() {
                    if is_leaf(&child)
                        || (top && skip.is_some() && k.cast::<PyString>().ok().and_then(|s| s.to_str().ok()) == skip)
                    {
                        continue;
                    }
                    push(child, Seg::Field(v.clone(), k), &mut stack);
                }
            }
            if let Ok(extra) = v.getattr(pyo3::intern!(py, "__pydantic_extra__"))
                && let Ok(extra) = extra.cast::<PyDict>()
            {
                for (k, child) in extra.iter() {
                    if !is_leaf(&child) {
                        push(child, Seg::Key(k), &mut stack);
                    }
                }
            }
        } else if let Some(names) = dataclass_fields(py, &v)? {
            if !seen.insert(v.as_ptr() as usize) {
                continue;
            }
            for name in names.iter() {
                let Ok(text) = name.cast::<PyString>() else { continue };
                if let Ok(child) = v.getattr(text)
                    && !is_leaf(&child)
                {
                    push(child, Seg::Key(name), &mut stack);
                }
            }
        }
    }
    Ok(None)
}

/// None, a str or an int (bool included): nothing to look into, nothing that can be NaN.
fn is_leaf(v: &Bound<'_, PyAny>) -> bool {
    v.is_none() || v.is_instance_of::<PyString>() || v.is_instance_of::<PyInt>()
}

/// An instance of a `BaseModel` subclass, by the type's MRO alone: `isinstance` would go through
/// pydantic's metaclass (an `ABCMeta`) and its `__instancecheck__`.
fn is_model(v: &Bound<'_, PyAny>, base_model: &Bound<'_, PyType>) -> bool {
    // SAFETY: both pointers are live type objects for the duration of the call (held by `v`
    // and by the module-level `BaseModel`); PyType_IsSubtype only reads their MROs.
    unsafe { pyo3::ffi::PyType_IsSubtype(v.get_type_ptr(), base_model.as_type_ptr()) != 0 }
}

/// Addresses hashed as they are: they are unique while the walk holds the objects, and
/// SipHash's cost was a visible part of a walk.
#[derive(Default)]
struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | u64::from(*b);
        }
    }
    fn write_usize(&mut self, n: usize) {
        // Objects are 16-byte aligned: the low bits carry nothing.
        self.0 = (n as u64 >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// The field names of a dataclass instance (not of a dataclass type), else None.
fn dataclass_fields<'py>(py: Python<'py>, v: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyList>>> {
    if v.is_instance_of::<PyType>() {
        return Ok(None);
    }
    let Some(fields) = v.get_type().getattr_opt(pyo3::intern!(py, "__dataclass_fields__"))? else {
        return Ok(None);
    };
    Ok(fields.cast::<PyDict>().ok().map(|f| f.keys()))
}

fn base_model(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    static CLS: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    CLS.import(py, "pydantic", "BaseModel")
}

/// Whether the value at `at` sits under a model field declared `exclude=True`.
fn excluded(py: Python<'_>, trail: &[(usize, Seg<'_>)], mut at: usize) -> PyResult<bool> {
    while at != 0 {
        let (parent, seg) = &trail[at];
        if let Seg::Field(model, name) = seg {
            let fields = model.get_type().getattr_opt(pyo3::intern!(py, "__pydantic_fields__"))?;
            if let Some(info) = fields.and_then(|f| f.get_item(name).ok())
                && info.getattr_opt(pyo3::intern!(py, "exclude"))?.is_some_and(|e| e.is_truthy().unwrap_or(false))
            {
                return Ok(true);
            }
        }
        at = *parent;
    }
    Ok(false)
}

fn path(trail: &[(usize, Seg<'_>)], mut at: usize) -> String {
    let mut segs = Vec::new();
    while at != 0 {
        let (parent, seg) = &trail[at];
        segs.push(seg);
        at = *parent;
    }
    let mut out = String::new();
    for seg in segs.into_iter().rev() {
        match seg {
            Seg::Key(k) | Seg::Field(_, k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                match k.str() {
                    Ok(k) => out.push_str(&k.to_string_lossy()),
                    Err(_) => out.push('?'),
                }
            }
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
            Seg::Root => {}
        }
    }
    if out.is_empty() { "the value itself".to_string() } else { out }
}
