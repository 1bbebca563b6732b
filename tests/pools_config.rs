//! The pools' configuration as files: the providers × classes matrix in TOML and JSON, the
//! seed's camelCase aliases, unknown fields refused, and every validation error naming its
//! cell; a run-time change that fails changes nothing.

use llm_bulkhead::pools::*;

const MATRIX: &str = r#"
maxAttempts = 3
[global]
maxActive = 40

[providers.primary]
connectionLimit = 32
[providers.secondary]
connection_limit = 16

[classes.interactive]
overflow = "fallback"
[classes.batch]
overflow = "degrade"

[partitions.primary-interactive]
provider = "primary"
trafficClass = "interactive"
activeLimit = 24
highPriorityReserve = 4
tokenBudget = 100000
retry = { budgetPercent = 20, minRetryConcurrency = 2 }
fallback = ["secondary-interactive"]

[partitions.secondary-interactive]
provider = "secondary"
traffic_class = "interactive"
active_limit = 12

[partitions.primary-batch]
provider = "primary"
class = "batch"
active_limit = 8
observe = true

[partitions.primary-batch-gold]
provider = "primary"
traffic_class = "batch"
tenantTier = "gold"
modelFamily = "large"
active_limit = 4
"#;

#[test]
fn the_matrix_reads_from_toml_and_json_with_aliases() {
    let c = PoolsConfig::from_toml(MATRIX).unwrap();
    c.validate().unwrap();
    let p = &c.partitions["primary-interactive"];
    assert_eq!(
        (p.active_limit, p.high_priority_reserve, p.token_budget),
        (24, 4, Some(100_000))
    );
    assert_eq!((p.retry.percent, p.retry.min), (20, 2));
    assert_eq!(
        c.partitions["primary-batch-gold"].tenant_tier.as_deref(),
        Some("gold")
    );
    assert!(c.partitions["primary-batch"].observe);
    // JSON, written by serde and read back.
    let json = serde_json::to_string(&c).unwrap();
    assert_eq!(PoolsConfig::from_json(&json).unwrap(), c);
    let pools = Pools::new(&c).unwrap();
    let gold = Classification::new("primary", "batch")
        .tenant_tier("gold")
        .model_family("large");
    assert_eq!(
        pools.name(pools.classify(&gold).unwrap()),
        "primary-batch-gold"
    );
    let plain = Classification::new("primary", "batch").tenant_tier("gold");
    assert_eq!(pools.name(pools.classify(&plain).unwrap()), "primary-batch");
    assert_eq!(
        pools.classify(&Classification::new("primary", "nope")),
        Err(RouteError::UnknownClass("nope".into()))
    );
    assert_eq!(
        pools.classify(&Classification::new("secondary", "batch")),
        Err(RouteError::NoPartition {
            provider: "secondary".into(),
            traffic_class: "batch".into()
        })
    );
}

#[test]
fn unknown_fields_are_refused_with_their_path() {
    let typo = MATRIX.replace("activeLimit = 24", "activeLimt = 24");
    let e = PoolsConfig::from_toml(&typo).unwrap_err().to_string();
    assert!(e.contains("unknown field `activeLimt`"), "{e}");
    assert!(e.contains("partitions.primary-interactive"), "{e}");
    let e = PoolsConfig::from_json(r#"{"global": {"maxActive": 1, "burst": 2}}"#)
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown field `burst`"), "{e}");
}

fn base() -> PoolsConfig {
    PoolsConfig::from_toml(MATRIX).unwrap()
}

fn err(c: &PoolsConfig) -> PoolsConfigError {
    let e = c.validate().unwrap_err();
    assert_eq!(Pools::new(c).unwrap_err(), e);
    e
}

#[test]
fn every_error_names_its_cell() {
    use PoolsConfigError::*;
    let pi = |c: &mut PoolsConfig| c.partitions.get_mut("primary-interactive").unwrap().clone();
    let set = |f: &dyn Fn(&mut PartitionConfig)| {
        let mut c = base();
        let mut p = pi(&mut c);
        f(&mut p);
        c.partitions.insert("primary-interactive".into(), p);
        err(&c)
    };
    let cell = "partitions.primary-interactive".to_string();
    assert_eq!(
        set(&|p| p.active_limit = 0),
        ZeroLimit {
            cell: cell.clone(),
            field: "active_limit"
        }
    );
    assert_eq!(
        set(&|p| p.token_budget = Some(0)),
        ZeroLimit {
            cell: cell.clone(),
            field: "token_budget"
        }
    );
    assert!(matches!(set(&|p| p.high_priority_reserve = 24),
        Inconsistent { cell: ref c, field: "high_priority_reserve", .. } if *c == cell));
    assert!(matches!(set(&|p| p.active_limit = 33),
        Inconsistent { cell: ref c, field: "active_limit", .. } if *c == cell));
    assert_eq!(
        set(&|p| p.retry.percent = 101),
        RetryPercentAbove100 {
            cell: cell.clone(),
            percent: 101
        }
    );
    assert_eq!(
        set(&|p| p.fallback = vec!["primary-interactive".into()]),
        FallbackToSelf { cell: cell.clone() }
    );
    assert_eq!(
        set(&|p| p.fallback = vec!["nowhere".into()]),
        Unknown {
            cell: cell.clone(),
            field: "fallback",
            name: "nowhere".into()
        }
    );
    assert_eq!(
        set(&|p| p.provider = "tertiary".into()),
        Unknown {
            cell: cell.clone(),
            field: "provider",
            name: "tertiary".into()
        }
    );
    assert_eq!(
        set(&|p| p.traffic_class = "bulk".into()),
        Unknown {
            cell: cell.clone(),
            field: "traffic_class",
            name: "bulk".into()
        }
    );
    // A fallback list on a class whose overflow is not `fallback`.
    let mut c = base();
    c.partitions.get_mut("primary-batch").unwrap().fallback = vec!["primary-interactive".into()];
    assert!(matches!(
        err(&c),
        Inconsistent {
            field: "fallback",
            ..
        }
    ));
    // Two partitions with one key.
    let mut c = base();
    let dup = c.partitions["secondary-interactive"].clone();
    c.partitions.insert("zz".into(), dup);
    assert_eq!(
        err(&c),
        DuplicateKey {
            cell: "partitions.zz".into(),
            other: "secondary-interactive".into()
        }
    );
    // Providers and the guard.
    let mut c = base();
    c.providers.get_mut("secondary").unwrap().connection_limit = 0;
    assert_eq!(
        err(&c),
        ZeroLimit {
            cell: "providers.secondary".into(),
            field: "connection_limit"
        }
    );
    let mut c = base();
    c.global.max_active = 0;
    assert_eq!(
        err(&c),
        ZeroLimit {
            cell: "global".into(),
            field: "max_active"
        }
    );
    let mut c = base();
    c.max_attempts = MAX_ATTEMPTS + 1;
    assert!(matches!(
        err(&c),
        Inconsistent {
            field: "max_attempts",
            ..
        }
    ));
}

#[test]
fn a_fallback_cycle_is_refused_naming_it() {
    let mut c = base();
    c.partitions
        .get_mut("secondary-interactive")
        .unwrap()
        .fallback = vec!["primary-interactive".into()];
    let e = err(&c);
    assert_eq!(
        e,
        PoolsConfigError::FallbackCycle {
            cycle: vec!["primary-interactive".into(), "secondary-interactive".into()]
        }
    );
    assert_eq!(
        e.to_string(),
        "fallback cycle: primary-interactive -> secondary-interactive -> primary-interactive"
    );
}

#[test]
fn a_refused_change_changes_nothing() {
    let c = base();
    let pools = Pools::new(&c).unwrap();
    let before = pools.stats();
    let mut next = c.partitions["primary-interactive"].clone();
    next.retry.percent = 150;
    assert!(matches!(
        pools.apply_partition("primary-interactive", &next),
        Err(PoolsConfigError::RetryPercentAbove100 { .. })
    ));
    next.retry.percent = 20;
    next.provider = "secondary".into();
    assert!(pools.apply_partition("primary-interactive", &next).is_err());
    assert!(pools.apply_partition("nope", &next).is_err());
    assert!(pools.apply_provider("primary", 20).is_err()); // below the partition's 24
    assert!(pools.apply_provider("nope", 20).is_err());
    assert!(pools.apply_global(0).is_err());
    assert_eq!(pools.stats(), before);
}

#[test]
fn a_class_that_waits_needs_a_bounded_queue() {
    let c = PoolsConfig::from_json(
        r#"{"global": {"maxActive": 4}, "providers": {"p": {"connectionLimit": 4}},
            "classes": {"w": {"overflow": "wait"}},
            "partitions": {"p-w": {"provider": "p", "trafficClass": "w", "activeLimit": 2,
                                   "pendingLimit": 3, "queueMaxAgeMs": 5000}}}"#,
    )
    .unwrap();
    let p = &c.partitions["p-w"];
    assert_eq!((p.pending_limit, p.queue_max_age_ms), (3, 5000));
    let pools = Pools::new(&c).unwrap();
    assert_eq!(pools.stats().partitions[0].pending_limit, 3);
    for field in ["pending_limit", "queue_max_age_ms"] {
        let mut bad = c.clone();
        let q = bad.partitions.get_mut("p-w").unwrap();
        if field == "pending_limit" {
            q.pending_limit = 0;
        } else {
            q.queue_max_age_ms = 0;
        }
        let want = PoolsConfigError::ZeroLimit {
            cell: "partitions.p-w".into(),
            field,
        };
        assert_eq!(bad.validate(), Err(want.clone()));
        // At run time too, and nothing changes.
        assert_eq!(
            pools.apply_partition("p-w", &bad.partitions["p-w"]),
            Err(want)
        );
        assert_eq!(pools.stats().partitions[0].limit_version, 1);
    }
    let mut big = c.clone();
    big.partitions.get_mut("p-w").unwrap().queue_max_age_ms = 86_400_001;
    assert!(matches!(
        big.validate(),
        Err(PoolsConfigError::TooLarge {
            field: "queue_max_age_ms",
            ..
        })
    ));
}
