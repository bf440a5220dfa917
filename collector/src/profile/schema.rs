//! The JSON Schema of `commtap.profile.v1`, made from the very types the JSON profile is
//! written from (their doc comments are its descriptions), so that the two cannot drift;
//! the repository ships it as `docs/commtap.profile.v1.schema.json` (a test keeps the file
//! equal to this), and the end-to-end tests check every profile they read against it.

use super::JobProfile;

/// The schema, pretty-printed, with a final newline. Closed: an object may hold only the
/// properties its type declares, so that a field the code writes and the schema does not
/// know fails the tests' check instead of passing unseen.
pub fn profile_schema() -> String {
    let mut schema = schemars::schema_for!(JobProfile);
    schema.insert("$id".into(), super::SCHEMA.into());
    schema.insert(
        "title".into(),
        "commtap.profile.v1: a job's MPI, NCCL and libfabric profile".into(),
    );
    let mut value = schema.to_value();
    close_objects(&mut value);
    serde_json::to_string_pretty(&value).expect("a schema is JSON") + "\n"
}

/// Sets `additionalProperties: false` on every object schema that lists its properties and
/// says nothing of others (maps keep theirs: a schema for every value).
fn close_objects(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(m) => {
            if m.contains_key("properties") && !m.contains_key("additionalProperties") {
                m.insert("additionalProperties".into(), false.into());
            }
            m.values_mut().for_each(close_objects);
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(close_objects),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_shipped_schema_is_the_one_the_code_makes() {
        let shipped = include_str!("../../../docs/commtap.profile.v1.schema.json");
        assert!(
            shipped == super::profile_schema(),
            "docs/commtap.profile.v1.schema.json is stale: run `commtap schema > \
             docs/commtap.profile.v1.schema.json`"
        );
    }
}
