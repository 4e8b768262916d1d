//! The configured schema name: the one identifier that cannot be a bind parameter, so the one
//! piece of text that reaches SQL from outside. It is checked here and quoted here, nowhere else.

use crate::store::{StoreError, StoreResult};

/// Accepts `[a-zA-Z_][a-zA-Z0-9_]*` of at most 63 bytes (10xGraph's rule and PostgreSQL's length
/// limit) and rejects anything else with `StoreError::InvalidInput` naming the schema, before any
/// connection is made.
pub fn validate_schema(schema: &str) -> StoreResult<()> {
    let ok = !schema.is_empty()
        && schema.len() <= 63
        && schema.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && schema.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok { Ok(()) } else { Err(StoreError::InvalidInput(format!("invalid schema name {schema:?}"))) }
}

/// The schema as a quoted SQL identifier, after `validate_schema`. It names the schema the
/// unquoted name always named (PostgreSQL folds an unquoted name to lower case, and earlier
/// releases spliced it in unquoted), so an existing database is found under the same schema; the
/// quotes make a reserved word such as `user` a valid schema too. Any `"` is doubled, so the
/// result is one identifier whatever the input, should the validation rule ever be widened.
pub fn quote_schema(schema: &str) -> StoreResult<String> {
    validate_schema(schema)?;
    Ok(format!("\"{}\"", schema.to_ascii_lowercase().replace('"', "\"\"")))
}

#[cfg(test)]
mod tests {
    use super::{quote_schema, validate_schema};

    #[test]
    fn schema_names_are_checked_and_quoted() {
        assert_eq!(quote_schema("public").unwrap(), "\"public\"");
        // The schema an unquoted `_Tenant_01` named: PostgreSQL folded it to lower case.
        assert_eq!(quote_schema("_Tenant_01").unwrap(), "\"_tenant_01\"");
        assert_eq!(quote_schema("user").unwrap(), "\"user\"");
        assert_eq!(quote_schema(&"a".repeat(63)).unwrap(), format!("\"{}\"", "a".repeat(63)));
        for bad in ["", "1x", "a-b", "a b", "a;drop", "q\"uote", "é", &"a".repeat(64)] {
            assert!(validate_schema(bad).is_err(), "{bad:?} accepted");
            assert!(quote_schema(bad).is_err(), "{bad:?} quoted");
        }
    }
}
