//! The `config` module: strict parsing (unknown fields, camelCase aliases, errors naming the
//! field and the bound), JSON and TOML round-trips, limits snapshots keyed by class name, and
//! the file helper that applies only newer revisions.

use llm_bulkhead::config::{
    apply_limits_file, BulkheadConfig, ClassConfig, FileOutcome, Format, LimitsConfig, LoadError,
};
use llm_bulkhead::{ApplyLimitsError, ConfigProblem, Demand, Profile, RejectReason, Reservation};
use std::path::PathBuf;

/// The seed's class example (seeds/000), in the reference's camelCase spelling.
const SEED_JSON: &str = r#"{
  "maxConcurrent": 20,
  "tokenBudget": { "budget": 50000 },
  "admissionClasses": {
    "defaultClass": "standard",
    "classes": {
      "latencySensitive": { "protectedConcurrent": 8, "maxConcurrent": 14,
                            "protectedInFlightTokens": 20000, "maxInFlightTokens": 36000 },
      "standard": { "protectedConcurrent": 3, "maxConcurrent": 8,
                    "protectedInFlightTokens": 8000, "maxInFlightTokens": 20000 },
      "background": { "maxConcurrent": 4, "maxInFlightTokens": 10000 }
    }
  }
}"#;

const SEED_TOML: &str = r#"
max_concurrent = 20

[token_budget]
budget = 50_000

[admission_classes]
default_class = "standard"

[admission_classes.classes.latencySensitive]
protected_concurrent = 8
max_concurrent = 14
protected_tokens = 20_000
max_tokens = 36_000

[admission_classes.classes.standard]
protected_concurrent = 3
max_concurrent = 8
protected_tokens = 8_000
max_tokens = 20_000

[admission_classes.classes.background]
max_concurrent = 4
max_tokens = 10_000
"#;

#[test]
fn the_seed_example_loads_from_json_and_toml_alike() {
    let json = BulkheadConfig::from_json(SEED_JSON).unwrap();
    let toml = BulkheadConfig::from_toml(SEED_TOML).unwrap();
    assert_eq!(json, toml);
    let classes = &json.admission_classes.as_ref().unwrap().classes;
    // Absent floors are 0, absent ceilings absent.
    assert_eq!(
        *classes.get("background").unwrap(),
        ClassConfig {
            protected_concurrent: 0,
            max_concurrent: Some(4),
            protected_tokens: 0,
            max_tokens: Some(10_000)
        }
    );
    let b = json.build().unwrap();
    assert_eq!(
        b.class_names(),
        ["latencySensitive", "standard", "background"]
    );
    let bg = b.class_id("background").unwrap();
    let l = b.limits();
    assert_eq!(l.classes.get(bg).unwrap().max_tokens, Some(10_000));
    // The class ceiling is enforced: 4 background slots, then concurrency_limit.
    let held: Vec<_> = (0..4)
        .map(|_| {
            b.try_acquire(Demand::tokens(Reservation::new(10, 10).unwrap()).in_class(bg))
                .unwrap()
        })
        .collect();
    let r = b
        .try_acquire(Demand::tokens(Reservation::new(10, 10).unwrap()).in_class(bg))
        .unwrap_err();
    assert_eq!(r.reason, RejectReason::ConcurrencyLimit);
    drop(held);
}

#[test]
fn json_and_toml_round_trip_every_field() {
    let full = BulkheadConfig::from_json(
        r#"{"max_concurrent": 12, "max_queue": 5, "timeout_ms": 1500, "profile": "batch",
            "initial_revision": 3, "measure_queue_waits": true, "mode": "observe",
            "shadow_reasons": ["budget_limit", "timeout"], "model": "gpt-4o",
            "token_budget": {"budget": 24000, "high_priority_reserve": 2000, "output_cap": 512},
            "admission_classes": {"default_class": "standard", "classes": {
                "premium": {"protected_concurrent": 6, "max_concurrent": 10, "protected_tokens": 12000, "max_tokens": 20000},
                "standard": {"protected_concurrent": 2, "max_concurrent": 6}}}}"#,
    )
    .unwrap();
    for format in [Format::Json, Format::Toml] {
        let text = full.write(format);
        let back = BulkheadConfig::parse(format, &text)
            .unwrap_or_else(|e| panic!("{} did not read back: {e}\n{text}", format.as_str()));
        assert_eq!(back, full, "{}", format.as_str());
    }
    let b = full.build().unwrap();
    assert_eq!(b.limits().max_queue, 5);
    assert_eq!(b.limits().revision, 3);
    assert_eq!(
        b.default_queue_timeout(),
        Some(std::time::Duration::from_millis(1500))
    );
    // What a built bulkhead reports round-trips too (without the LLM-only fields).
    let of = BulkheadConfig::of(&b);
    assert_eq!(of.admission_classes, full.admission_classes);
    assert_eq!(BulkheadConfig::from_toml(&of.to_toml()).unwrap(), of);
    let limits = LimitsConfig::of(&b);
    for format in [Format::Json, Format::Toml] {
        assert_eq!(
            LimitsConfig::parse(format, &limits.write(format)).unwrap(),
            limits
        );
    }
}

#[test]
fn a_typo_is_an_error_that_names_the_field_everywhere() {
    let cases = [
        (
            r#"{"max_concurrent": 4, "max_concurent": 5}"#,
            "max_concurent",
        ),
        (
            r#"{"max_concurrent": 4, "token_budget": {"budget": 1, "reserve": 1}}"#,
            "reserve",
        ),
        (
            r#"{"max_concurrent": 4, "admission_classes": {"default_class": "a", "classes": {"a": {"max_token": 10000}}}}"#,
            "max_token",
        ),
        (
            r#"{"max_concurrent": 4, "admission_classes": {"default": "a", "classes": {}}}"#,
            "default",
        ),
    ];
    for (text, field) in cases {
        let e = BulkheadConfig::from_json(text).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains(&format!("unknown field `{field}`")),
            "{text}: {msg}"
        );
    }
    let e = BulkheadConfig::from_toml(
        "max_concurrent = 4\n[admission_classes]\ndefault_class = \"a\"\n[admission_classes.classes.a]\nmax_token = 10000\n",
    )
    .unwrap_err();
    assert!(
        matches!(&e, LoadError::Parse { format: Format::Toml, path, .. } if path == "admission_classes.classes.a.max_token"),
        "{e:?}"
    );
    assert!(e.to_string().contains("unknown field `max_token`"), "{e}");
    // Snapshots are as strict.
    let e = LimitsConfig::from_json(
        r#"{"revision": 1, "max_concurrent": 1, "max_queue": 0, "maxconcurrent": 2}"#,
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("unknown field `maxconcurrent`"),
        "{e}"
    );
}

#[test]
fn errors_name_the_field_and_the_bound() {
    // Out of the type's range: the path and the type.
    let e = BulkheadConfig::from_json(r#"{"max_concurrent": 4, "token_budget": {"budget": -5}}"#)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "token_budget.budget: invalid value: integer `-5`, expected u64 at line 1 column 51"
    );
    // A required field.
    let e = BulkheadConfig::from_json(r#"{"max_queue": 4}"#).unwrap_err();
    assert!(
        e.to_string().contains("missing field `max_concurrent`"),
        "{e}"
    );
    // Out of the packed words' range: the field and the bound, from validation.
    let c = BulkheadConfig::from_json(r#"{"maxConcurrent": 40000}"#).unwrap();
    assert_eq!(
        c.build().unwrap_err().to_string(),
        "max_concurrent = 40000 exceeds the largest supported value 32767"
    );
    let c = BulkheadConfig::from_json(
        r#"{"max_concurrent": 4, "token_budget": {"budget": 100, "highPriorityReserve": 200}}"#,
    )
    .unwrap();
    let e = c.build().unwrap_err();
    assert_eq!(e.field, "token_budget.high_priority_reserve");
    assert!(matches!(
        e.problem,
        ConfigProblem::ReserveExceedsBudget {
            reserve: 200,
            budget: 100
        }
    ));
    // A floor above its ceiling names the class.
    let c = BulkheadConfig::from_json(
        r#"{"max_concurrent": 10, "admission_classes": {"default_class": "a", "classes": {"a": {"protectedConcurrent": 5, "maxConcurrent": 3}}}}"#,
    )
    .unwrap();
    let msg = c.build().unwrap_err().to_string();
    assert!(
        msg.contains("\"a\"") && msg.contains("5") && msg.contains("3"),
        "{msg}"
    );
    // Duplicate class names are refused, not merged.
    let e = BulkheadConfig::from_json(
        r#"{"max_concurrent": 4, "admission_classes": {"default_class": "a", "classes": {"a": {}, "a": {"maxConcurrent": 1}}}}"#,
    )
    .unwrap_err();
    assert!(e.to_string().contains("given twice"), "{e}");
    // Nine classes are too many.
    let nine: Vec<String> = (0..9).map(|i| format!("\"c{i}\": {{}}")).collect();
    let text = format!(
        r#"{{"max_concurrent": 4, "admission_classes": {{"default_class": "c0", "classes": {{{}}}}}}}"#,
        nine.join(",")
    );
    assert!(BulkheadConfig::from_json(&text)
        .unwrap_err()
        .to_string()
        .contains("at most 8"));
    // Trailing garbage after the document.
    assert!(BulkheadConfig::from_json(r#"{"max_concurrent": 4} x"#).is_err());
    // A wrong profile name.
    let e = BulkheadConfig::from_json(r#"{"max_concurrent": 4, "profile": "bulk"}"#).unwrap_err();
    assert!(
        matches!(&e, LoadError::Parse { path, .. } if path == "profile"),
        "{e:?}"
    );
}

#[test]
fn profiles_and_explicit_fields_combine_like_the_builder() {
    let c = BulkheadConfig::from_toml("max_concurrent = 4\nprofile = \"batch\"\n").unwrap();
    assert_eq!(c.profile, Some(Profile::Batch));
    let b = c.build().unwrap();
    assert_eq!(b.limits().max_queue, 20);
    let c = BulkheadConfig::from_toml("max_concurrent = 4\nprofile = \"batch\"\nmax_queue = 2\n")
        .unwrap();
    assert_eq!(c.build().unwrap().limits().max_queue, 2);
}

fn classed() -> llm_bulkhead::Bulkhead {
    BulkheadConfig::from_json(SEED_JSON)
        .unwrap()
        .build()
        .unwrap()
}

#[test]
fn limits_snapshots_are_keyed_by_class_name_in_any_order() {
    let b = classed();
    let snapshot = LimitsConfig::from_json(
        r#"{"revision": 1, "maxConcurrent": 20, "maxQueue": 0, "tokenBudget": {"budget": 50000},
            "admissionClasses": {
              "background": {"maxConcurrent": 1},
              "standard": {"protectedConcurrent": 3, "maxConcurrent": 8},
              "latencySensitive": {"protectedConcurrent": 8}}}"#,
    )
    .unwrap();
    let change = snapshot.apply(&b).unwrap();
    assert_eq!(change.current.revision, 1);
    let l = b.limits();
    let id = |n| b.class_id(n).unwrap();
    assert_eq!(
        l.classes.get(id("background")).unwrap().max_concurrent,
        Some(1)
    );
    assert_eq!(l.classes.get(id("background")).unwrap().max_tokens, None);
    assert_eq!(
        l.classes
            .get(id("latencySensitive"))
            .unwrap()
            .protected_tokens,
        0
    );
    // Reading the current snapshot back gives the same names and numbers.
    let back = LimitsConfig::of(&b);
    assert_eq!(back.revision, 1);
    assert_eq!(
        back.admission_classes
            .unwrap()
            .get("background")
            .unwrap()
            .max_concurrent,
        Some(1)
    );
}

#[test]
fn a_snapshot_with_wrong_classes_installs_nothing() {
    let b = classed();
    let before = b.limits();
    let unknown = LimitsConfig::from_json(
        r#"{"revision": 1, "max_concurrent": 20, "max_queue": 0, "token_budget": {"budget": 1},
            "admission_classes": {"latencySensitive": {}, "standard": {}, "background": {}, "tenant-42": {}}}"#,
    )
    .unwrap();
    match unknown.apply(&b).unwrap_err() {
        LoadError::UnknownClass { class, known } => {
            assert_eq!(class, "tenant-42");
            assert_eq!(known.len(), 3);
        }
        e => panic!("{e:?}"),
    }
    let missing = LimitsConfig::from_json(
        r#"{"revision": 1, "max_concurrent": 20, "max_queue": 0, "token_budget": {"budget": 1},
            "admission_classes": {"latencySensitive": {}, "standard": {}}}"#,
    )
    .unwrap();
    let e = missing.apply(&b).unwrap_err();
    assert!(
        matches!(&e, LoadError::MissingClass { class } if class == "background"),
        "{e:?}"
    );
    assert!(e.to_string().contains("\"background\" is missing"));
    // Floors above the global limit: validation by the core, with the bound.
    let floors = LimitsConfig::from_json(
        r#"{"revision": 1, "max_concurrent": 4, "max_queue": 0, "token_budget": {"budget": 50000},
            "admission_classes": {"latencySensitive": {"protectedConcurrent": 3}, "standard": {"protectedConcurrent": 3}, "background": {}}}"#,
    )
    .unwrap();
    let e = floors.apply(&b).unwrap_err();
    assert!(
        matches!(&e, LoadError::Apply(ApplyLimitsError::Invalid(c)) if matches!(c.problem, ConfigProblem::FloorsExceedLimit { sum: 6, limit: 4 })),
        "{e:?}"
    );
    assert_eq!(b.limits(), before);
    // No classes on a bulkhead with classes; classes on one without.
    let none = LimitsConfig {
        revision: 1,
        max_concurrent: 1,
        ..Default::default()
    };
    assert!(matches!(
        none.apply(&b),
        Err(LoadError::MissingClass { .. })
    ));
    let plain = llm_bulkhead::Bulkhead::new(2).unwrap();
    let with: LimitsConfig = LimitsConfig::from_json(
        r#"{"revision": 1, "max_concurrent": 1, "max_queue": 0, "classes": {"a": {}}}"#,
    )
    .unwrap();
    assert!(matches!(
        with.apply(&plain),
        Err(LoadError::UnexpectedClasses)
    ));
    assert_eq!(b.limits(), before);
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let p =
            std::env::temp_dir().join(format!("llm-bulkhead-config-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn the_file_helper_applies_only_newer_revisions() {
    let dir = TempDir::new("apply");
    let b = classed();
    let toml_path = dir.0.join("limits.toml");
    let snapshot = |revision: u64, max: u32| {
        format!(
            "revision = {revision}\nmax_concurrent = {max}\nmax_queue = 0\n[token_budget]\nbudget = 50000\n\
             [admission_classes.latencySensitive]\n[admission_classes.standard]\n[admission_classes.background]\n"
        )
    };
    std::fs::write(&toml_path, snapshot(5, 0)).unwrap();
    let out = apply_limits_file(&b, &toml_path).unwrap();
    assert!(out.applied());
    assert_eq!(b.limits().max_concurrent, 0);
    // The same file again: not newer, nothing changes, no error.
    assert_eq!(
        apply_limits_file(&b, &toml_path).unwrap(),
        FileOutcome::NotNewer {
            file_revision: 5,
            current_revision: 5
        }
    );
    // An older file is not applied either.
    std::fs::write(&toml_path, snapshot(4, 20)).unwrap();
    assert!(!apply_limits_file(&b, &toml_path).unwrap().applied());
    assert_eq!(b.limits().max_concurrent, 0);
    // A newer JSON file lifts the kill switch.
    let json_path = dir.0.join("limits.json");
    let json = LimitsConfig {
        revision: 6,
        max_concurrent: 20,
        ..LimitsConfig::of(&b)
    };
    std::fs::write(&json_path, json.to_json()).unwrap();
    assert!(apply_limits_file(&b, &json_path).unwrap().applied());
    assert_eq!(b.limits().max_concurrent, 20);
    // Bad files are typed errors.
    std::fs::write(&json_path, r#"{"revision": 9, "max_concurrent": 20}"#).unwrap();
    assert!(
        matches!(apply_limits_file(&b, &json_path), Err(LoadError::Parse { ref message, .. }) if message.contains("missing field `max_queue`"))
    );
    assert!(matches!(
        apply_limits_file(&b, &dir.0.join("absent.json")),
        Err(LoadError::Io { .. })
    ));
    assert!(matches!(
        apply_limits_file(&b, &dir.0.join("limits.yaml")),
        Err(LoadError::UnsupportedFormat { .. })
    ));
    assert_eq!(b.limits().revision, 6);
}

#[test]
fn bulkhead_config_reads_files_too() {
    let dir = TempDir::new("read");
    let p = dir.0.join("bulkhead.toml");
    std::fs::write(&p, SEED_TOML).unwrap();
    assert_eq!(
        BulkheadConfig::from_file(&p).unwrap(),
        BulkheadConfig::from_json(SEED_JSON).unwrap()
    );
}

/// Class names that differ only by white space or Unicode normalisation are one name in both
/// configuration types and both formats: given twice, they are refused (before, `LimitsConfig`
/// kept the last, and `"a"` lost its ceiling). Names with control or bidirectional formatting
/// characters are refused.
#[test]
fn class_names_are_compared_trimmed_and_normalised() {
    let b = BulkheadConfig::from_json(
        r#"{"max_concurrent": 8, "admission_classes": {"default_class": "a", "classes": {"a": {"maxConcurrent": 1}, "b": {}}}}"#,
    )
    .unwrap()
    .build()
    .unwrap();
    for twin in ["a ", " a", "a\\t", "a\\u00a0", "\\u3000a"] {
        let json = format!(
            r#"{{"revision": 1, "max_concurrent": 8, "max_queue": 0, "classes": {{"a": {{"max_concurrent": 1}}, "b": {{}}, "{twin}": {{}}}}}}"#
        );
        let e = LimitsConfig::from_json(&json).unwrap_err();
        assert!(
            matches!(&e, LoadError::Parse { path, .. } if path.starts_with("classes")),
            "{twin}: {e:?}"
        );
        assert!(e.to_string().contains("given twice"), "{e}");
        let bulkhead = format!(
            r#"{{"max_concurrent": 8, "admission_classes": {{"default_class": "a", "classes": {{"a": {{}}, "{twin}": {{}}}}}}}}"#
        );
        assert!(BulkheadConfig::from_json(&bulkhead).is_err(), "{twin}");
    }
    let toml = "revision = 1\nmax_concurrent = 8\nmax_queue = 0\n[classes.a]\nmax_concurrent = 1\n[classes.b]\n[classes.\"a \"]\n";
    let e = LimitsConfig::from_toml(toml).unwrap_err();
    assert!(e.to_string().contains("given twice"), "{e}");
    // Two Unicode spellings of "é": one name.
    let e = LimitsConfig::from_json(
        r#"{"revision": 1, "max_concurrent": 8, "max_queue": 0, "classes": {"caf\u00e9": {}, "cafe\u0301": {}}}"#,
    )
    .unwrap_err();
    assert!(e.to_string().contains("given twice"), "{e}");
    // A single spelling with white space names the class; its ceiling is kept.
    let one = LimitsConfig::from_json(
        r#"{"revision": 1, "max_concurrent": 8, "max_queue": 0, "classes": {" a\t": {"max_concurrent": 1}, "b": {}}}"#,
    )
    .unwrap();
    one.apply(&b).unwrap();
    let a = b.class_id("a").unwrap();
    let held = b.try_acquire(Demand::slot().in_class(a)).unwrap();
    assert!(b.try_acquire(Demand::slot().in_class(a)).is_err());
    drop(held);
    // Control and bidirectional formatting characters are refused, in every config type and
    // in the builder (a typed `ConfigProblem::ClassTable`).
    for bad in ["a\\u0000", "ad\\u202emin", "a\\u001b[31m", "a\\u2066b"] {
        let json = format!(r#"{{"{bad}": {{}}}}"#);
        assert!(
            serde_json::from_str::<llm_bulkhead::config::ClassMap>(&json).is_err(),
            "{bad}"
        );
    }
    let e = llm_bulkhead::Bulkhead::builder()
        .max_concurrent(2)
        .class("ad\u{202e}min", llm_bulkhead::ClassLimits::default())
        .default_class("ad\u{202e}min")
        .build()
        .unwrap_err();
    assert!(
        matches!(e.problem, ConfigProblem::ClassTable(why) if why.contains("bidirectional")),
        "{e:?}"
    );
    let e = llm_bulkhead::Bulkhead::builder()
        .max_concurrent(2)
        .class("a", llm_bulkhead::ClassLimits::default())
        .class("a\u{a0}", llm_bulkhead::ClassLimits::default())
        .default_class("a")
        .build()
        .unwrap_err();
    assert_eq!(
        e.problem,
        ConfigProblem::ClassTable("class names must be unique")
    );
}

/// A 1 MB configuration (10 MB behaves the same) yields an error of a few hundred bytes, in both formats, whatever
/// the error (a syntax error on a long line, a wrong-typed 10 MB value, a 10 MB key).
#[test]
fn config_errors_quote_a_bounded_excerpt() {
    let big = "x".repeat(1 << 20);
    let cases = [
        (Format::Json, format!(r#"{{"max_concurrent": "{big}"}}"#)),
        (Format::Json, format!(r#"{{"max_concurrent": 1, "{big}": 1}}"#)),
        (Format::Json, format!(r#"{{"max_concurrent": 1, "admission_classes": {{"default_class": "a", "classes": {{"{big}": {{"bogus": 1}}}}}}}}"#)),
        (Format::Json, format!(r#"{{"max_concurrent": [{}]}}"#, "1,".repeat(1 << 19))),
        (Format::Toml, format!("max_concurrent = \"{big}\"\n")),
        (Format::Toml, format!("max_concurrent = 1\nmodel = \"{big}\" bogus\n")),
        (Format::Toml, format!("max_concurrent = [{}\n", "1,".repeat(1 << 19))),
        (Format::Toml, format!("max_concurrent = 1\n[admission_classes]\ndefault_class = \"a\"\n[admission_classes.classes.{big}]\nbogus = 1\n")),
    ];
    for (i, (format, text)) in cases.iter().enumerate() {
        let e = BulkheadConfig::parse(*format, text).unwrap_err();
        let LoadError::Parse { path, message, .. } = &e else {
            panic!("case {i}: {e:?}");
        };
        let shown = e.to_string();
        assert!(
            shown.len() < 600 && path.len() < 200 && message.len() < 400,
            "case {i}: a {}-byte message: {}",
            shown.len(),
            &shown[..shown.len().min(300)]
        );
        // Still an error that says where and what.
        assert!(
            shown.contains("line") || !path.is_empty(),
            "case {i}: {shown}"
        );
    }
}

/// A snapshot naming an unknown class of a megabyte quotes a bounded excerpt of it.
#[test]
fn an_unknown_class_is_quoted_bounded() {
    let b = BulkheadConfig::from_json(
        r#"{"max_concurrent": 2, "admission_classes": {"default_class": "a", "classes": {"a": {}}}}"#,
    )
    .unwrap()
    .build()
    .unwrap();
    let name = "t".repeat(1 << 20);
    let json = format!(
        r#"{{"revision": 1, "max_concurrent": 2, "max_queue": 0, "classes": {{"a": {{}}, "{name}": {{}}}}}}"#
    );
    let e = LimitsConfig::from_json(&json)
        .unwrap()
        .apply(&b)
        .unwrap_err();
    assert!(matches!(&e, LoadError::UnknownClass { class, .. } if class.len() == 1 << 20));
    assert!(e.to_string().len() < 400, "{}", e.to_string().len());
}

/// `BulkheadConfig::of` reads back `measure_queue_waits` (it was always written as off).
#[test]
fn of_keeps_measure_queue_waits() {
    let config = BulkheadConfig {
        max_concurrent: 2,
        max_queue: Some(1),
        measure_queue_waits: true,
        ..Default::default()
    };
    assert_eq!(BulkheadConfig::of(&config.build().unwrap()), config);
}
