//! The Grafana dashboard (`dist/pagesift-dashboard.json`) is valid and
//! shows what the daemon exports.
//!
//! No Grafana server can be installed here (see `tests/grafana/README.md`),
//! so instead of loading it into one, this test checks
//! - the dashboard against Grafana's dashboard JSON schema, every query
//!   against the Prometheus query schema and every time series panel's
//!   options and field config against that panel's schema;
//! - what the schemas cannot: unique panel ids and query ids, panels that
//!   fit the 24-column grid without overlapping, one datasource variable
//!   that every panel and query uses;
//! - every query parses as PromQL (`promql-parser`), and every metric it
//!   names, every label it matches or groups by and every `{{label}}` of
//!   its legend is one the daemon really exports: the names and labels are
//!   read from a scrape of [`Metrics`] after a snapshot with levels and
//!   savings lines, not from a list kept by hand (plus `instance` and
//!   `job`, which Prometheus adds);
//! - the panels the operator needs are there: saved memory per cgroup over
//!   time, the CPU of the daemon and of ksmd, COW breaks, regions per level.

use pagesift_core::pipeline::savings::{Limits, ProcessSavings, Savings, breakdown};
use pagesift_daemon::metrics::Metrics;
use pagesift_daemon::status::{LevelStatus, Status};
use promql_parser::parser::{Expr, LabelModifier};
use promql_parser::util::{ExprVisitor, walk_expr};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

const DASHBOARD: &str = include_str!("../../../dist/pagesift-dashboard.json");

fn schema(name: &str) -> Value {
    let path = format!("{}/tests/grafana/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// Every error of `instance` against `schema` (empty: valid), each with
/// where it is.
fn violations(schema: &Value, instance: &Value) -> Vec<String> {
    let v = jsonschema::validator_for(schema).expect("a valid schema");
    v.iter_errors(instance)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}

/// A definition of a schema file as a schema of its own.
fn definition(file: &Value, name: &str) -> Value {
    serde_json::json!({
        "$schema": file["$schema"],
        "$ref": format!("#/definitions/{name}"),
        "definitions": file["definitions"],
    })
}

fn dashboard() -> Value {
    serde_json::from_str(DASHBOARD).expect("dist/pagesift-dashboard.json is JSON")
}

fn panels(d: &Value) -> &Vec<Value> {
    d["panels"].as_array().expect("panels")
}

#[test]
fn the_dashboard_matches_grafanas_schemas() {
    let d = dashboard();
    let errors = violations(&schema("dashboard.jsonschema.json"), &d);
    assert!(errors.is_empty(), "dashboard: {errors:#?}");
    let query = schema("prometheus.jsonschema.json");
    let ts = schema("timeseries.jsonschema.json");
    let (options, custom) = (definition(&ts, "Options"), definition(&ts, "FieldConfig"));
    for p in panels(&d) {
        let title = p["title"].as_str().unwrap_or("?");
        for t in p["targets"].as_array().expect("targets") {
            let errors = violations(&query, t);
            assert!(errors.is_empty(), "{title}: query {t}: {errors:#?}");
        }
        if p["type"] == "timeseries" {
            let errors = violations(&options, &p["options"]);
            assert!(errors.is_empty(), "{title}: options: {errors:#?}");
            let errors = violations(&custom, &p["fieldConfig"]["defaults"]["custom"]);
            assert!(errors.is_empty(), "{title}: field config: {errors:#?}");
        }
    }
    // The schemas do catch mistakes (a guard against a schema that
    // accepts anything).
    let mut broken = d.clone();
    broken["panels"][0]["gridPos"]["w"] = 30.into();
    broken["graphTooltip"] = 7.into();
    assert_eq!(
        violations(&schema("dashboard.jsonschema.json"), &broken).len(),
        2
    );
    let mut bad_query = panels(&d)[0]["targets"][0].clone();
    bad_query["expresion"] = "typo".into();
    assert!(!violations(&query, &bad_query).is_empty());
}

#[test]
fn panels_tile_the_grid_and_use_the_datasource_variable() {
    let d = dashboard();
    let vars = d["templating"]["list"].as_array().unwrap();
    assert!(
        vars.iter().any(|v| v["type"] == "datasource"
            && v["name"] == "datasource"
            && v["query"] == "prometheus"),
        "{vars:?}"
    );
    let mut ids = BTreeSet::new();
    let mut cells: BTreeMap<(u64, u64), String> = BTreeMap::new();
    for p in panels(&d) {
        let title = p["title"].as_str().unwrap().to_string();
        assert!(ids.insert(p["id"].as_u64().unwrap()), "{title}: id reused");
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title}");
        let mut refs = BTreeSet::new();
        for t in p["targets"].as_array().unwrap() {
            assert_eq!(t["datasource"]["uid"], "${datasource}", "{title}");
            assert!(
                refs.insert(t["refId"].as_str().unwrap()),
                "{title}: refId reused"
            );
        }
        let g = &p["gridPos"];
        let [x, y, w, h] = ["x", "y", "w", "h"].map(|k| g[k].as_u64().unwrap());
        assert!(x + w <= 24, "{title}: past the 24 columns");
        for cx in x..x + w {
            for cy in y..y + h {
                if let Some(other) = cells.insert((cx, cy), title.clone()) {
                    panic!("{title} overlaps {other} at ({cx}, {cy})");
                }
            }
        }
    }
}

/// What a scrape of the daemon shows: every sample's metric name, with the
/// labels it carries.
fn exported() -> BTreeMap<String, BTreeSet<String>> {
    let mut m = Metrics::new();
    let procs: Vec<ProcessSavings> = (0..4)
        .map(|i| ProcessSavings {
            pid: 100 + i,
            comm: format!("qemu-{i}"),
            cgroup: format!("/machine.slice/vm{i}.scope/emulator"),
            savings: Savings {
                merged_pages: 1000 * u64::from(i),
                saved_bytes: 4_000_000 * i64::from(i),
                cow_breaks: u64::from(i),
            },
        })
        .collect();
    let status = Status {
        levels: (0..4)
            .map(|level| LevelStatus {
                level,
                region_count: 3,
                ..LevelStatus::default()
            })
            .collect(),
        savings: breakdown(
            &procs,
            Limits {
                cgroup_depth: 2,
                top_cgroups: 2,
                top_processes: 2,
            },
        ),
        daemon: pagesift_daemon::status::DaemonStatus {
            cpu_by_phase: [("sweep".to_string(), 1.0)].into_iter().collect(),
            cpu_by_thread: [("main".to_string(), 1.0)].into_iter().collect(),
            ..Default::default()
        },
        discovery: pagesift_daemon::status::DiscoveryStatus {
            maps_reads: 10,
            smaps_reads: 1,
            smaps_by_reason: [("mergeable_recheck".to_string(), 1)].into_iter().collect(),
            ..Default::default()
        },
        ..Status::default()
    };
    m.update(&status);
    let text = m.encode();
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text.lines() {
        // `# TYPE name kind`: a family, even one without samples yet.
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            let sample = if kind == "counter" {
                format!("{name}_total")
            } else {
                name.to_string()
            };
            out.entry(sample).or_default();
        } else if !line.starts_with('#') && !line.is_empty() {
            let (name, labels) = match line.split_once('{') {
                Some((n, rest)) => (n, rest.rsplit_once('}').unwrap().0),
                None => (line.split_once(' ').unwrap().0, ""),
            };
            let set = out.entry(name.to_string()).or_default();
            for pair in labels.split(',').filter(|p| !p.is_empty()) {
                set.insert(pair.split_once('=').unwrap().0.to_string());
            }
        }
    }
    out
}

/// The vector selectors of an expression, and the labels it groups or
/// matches by.
#[derive(Default)]
struct Uses {
    selectors: Vec<(String, Vec<String>)>,
    grouping: Vec<String>,
}

impl ExprVisitor for Uses {
    type Error = String;
    fn pre_visit(&mut self, e: &Expr) -> Result<bool, String> {
        let mut selector = |vs: &promql_parser::parser::VectorSelector| {
            let name = vs
                .name
                .clone()
                .ok_or_else(|| format!("a selector without a metric name: {vs}"))?;
            let labels = vs
                .matchers
                .matchers
                .iter()
                .map(|m| m.name.clone())
                .collect();
            self.selectors.push((name, labels));
            Ok::<(), String>(())
        };
        match e {
            Expr::VectorSelector(vs) => selector(vs)?,
            Expr::MatrixSelector(ms) => selector(&ms.vs)?,
            Expr::Aggregate(a) => {
                if let Some(LabelModifier::Include(l) | LabelModifier::Exclude(l)) = &a.modifier {
                    self.grouping.extend(l.labels.iter().cloned());
                }
            }
            Expr::Binary(b) => {
                if let Some(m) = b.modifier.as_ref().and_then(|m| m.matching.as_ref()) {
                    self.grouping.extend(m.labels().labels.iter().cloned());
                }
            }
            _ => {}
        }
        Ok(true)
    }
}

/// A query as Prometheus receives it: Grafana's variables replaced by
/// values of their kind.
fn interpolate(expr: &str) -> String {
    expr.replace("$__rate_interval", "5m")
        .replace("$__interval", "1m")
        .replace("$instance", ".*")
}

/// The `{{label}}`s of a legend format.
fn legend_labels(legend: &str) -> Vec<String> {
    legend
        .split("{{")
        .skip(1)
        .filter_map(|s| s.split_once("}}"))
        .map(|(l, _)| l.trim().to_string())
        .collect()
}

#[test]
fn every_query_names_metrics_and_labels_the_daemon_exports() {
    let exported = exported();
    // Prometheus adds these to every scraped sample.
    let target_labels = ["instance", "job"];
    let d = dashboard();
    let mut used: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut checked = 0;
    for p in panels(&d) {
        let title = p["title"].as_str().unwrap();
        for t in p["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap();
            let ast = promql_parser::parser::parse(&interpolate(expr))
                .unwrap_or_else(|e| panic!("{title}: {expr:?} is not PromQL: {e}"));
            let mut uses = Uses::default();
            walk_expr(&mut uses, &ast).unwrap_or_else(|e| panic!("{title}: {expr}: {e}"));
            assert!(
                !uses.selectors.is_empty(),
                "{title}: {expr} reads no metric"
            );
            let mut labels: BTreeSet<&str> = target_labels.into();
            for (name, matched) in &uses.selectors {
                let Some(have) = exported.get(name) else {
                    panic!(
                        "{title}: {expr}: the daemon exports no {name}; it exports {:?}",
                        exported.keys()
                    );
                };
                labels.extend(have.iter().map(String::as_str));
                for l in matched {
                    assert!(
                        have.contains(l) || target_labels.contains(&l.as_str()),
                        "{title}: {expr}: {name} has no label {l} ({have:?})"
                    );
                }
                used.entry(name.clone())
                    .or_default()
                    .push(p["type"].as_str().unwrap().into());
            }
            let legend = t["legendFormat"].as_str().unwrap_or("");
            for l in uses.grouping.iter().chain(&legend_labels(legend)) {
                assert!(
                    labels.contains(l.as_str()),
                    "{title}: {expr}: no label {l} to group or name by"
                );
            }
            checked += 1;
        }
    }
    // The host variable's values come from an exported metric's label.
    let var = d["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "instance")
        .expect("the instance variable");
    let q = var["query"].as_str().unwrap();
    let (metric, label) = q
        .strip_prefix("label_values(")
        .and_then(|r| r.strip_suffix(')'))
        .and_then(|r| r.split_once(", "))
        .unwrap_or_else(|| panic!("{q}"));
    assert!(exported.contains_key(metric), "{q}");
    assert!(target_labels.contains(&label), "{q}");
    // What the operator needs, each on a time series panel.
    for needed in [
        "pagesift_cgroup_saved_bytes",
        "pagesift_daemon_cpu_seconds_total",
        "pagesift_ksmd_cpu_seconds_total",
        "pagesift_cow_breaks_total",
        "pagesift_cgroup_cow_breaks",
        "pagesift_level_regions",
    ] {
        assert!(
            used.get(needed)
                .is_some_and(|kinds| kinds.iter().any(|k| k == "timeseries")),
            "no time series panel shows {needed}"
        );
    }
    assert!(checked >= 10, "{checked} queries");
}

#[test]
fn an_unexported_metric_or_label_would_be_caught() {
    let exported = exported();
    assert!(exported["pagesift_cgroup_saved_bytes"].contains("cgroup"));
    assert!(exported["pagesift_process_saved_bytes"].contains("comm"));
    assert!(exported["pagesift_level_regions"].contains("level"));
    assert!(exported.contains_key("pagesift_cow_breaks_total"));
    assert!(!exported.contains_key("pagesift_cow_breaks"));
    let mut uses = Uses::default();
    let ast =
        promql_parser::parser::parse("sum by (vm) (rate(pagesift_nothing{x=\"1\"}[5m]))").unwrap();
    walk_expr(&mut uses, &ast).unwrap();
    assert_eq!(
        uses.selectors,
        [("pagesift_nothing".to_string(), vec!["x".to_string()])]
    );
    assert_eq!(uses.grouping, ["vm"]);
    assert_eq!(
        legend_labels("level {{level}} of {{ instance }}"),
        ["level", "instance"]
    );
}
