# Tests for default.rego: opa test policies/
package toolkeeper_test

import rego.v1



call(argv) := {
	"tool": {"name": "release", "tier": "gated", "runner": "argv", "visibility": "inline"},
	"arguments": {},
	"argv": argv,
	"agent": {"id": "a1b2c3", "header": null},
	"mode": {"yolo": true, "interactive": false},
	"request": {"id": "r1", "time": "2026-11-30T18:00:00+00:00", "weekday": "mon", "hour": 18},
}

test_an_ordinary_call_meets_no_objection if {
	data.toolkeeper.decision.effect == "allow" with input as call(["./release.sh", "1.4.2", "--channel=beta"])
}

test_an_ssh_key_is_denied if {
	d := data.toolkeeper.decision with input as call(["./release.sh", "--notes=~/.ssh/id_rsa"])
	d.effect == "deny"
	d.rule == "credentials-never"
}

test_a_dotenv_file_is_denied if {
	data.toolkeeper.decision.effect == "deny" with input as call(["notes", "read", ".env"])
}

test_a_force_flag_asks if {
	d := data.toolkeeper.decision with input as call(["git", "push", "--force"])
	d.effect == "ask"
	d.rule == "destructive-flags-ask"
}

test_a_force_flag_inside_a_value_does_not_ask if {
	data.toolkeeper.decision.effect == "allow" with input as call(["./release.sh", "--notes=--force"])
}

test_deny_wins_over_ask if {
	data.toolkeeper.decision.effect == "deny" with input as call(["cp", "--force", "/home/me/.ssh/id_ed25519"])
}

test_an_agents_own_call_without_argv_meets_no_objection if {
	agent_call := object.union(call([]), {
		"tool": {"name": "Bash", "source": "agent", "tier": null, "runner": null, "visibility": null},
		"arguments": {"command": "git push --force"},
		"argv": null,
	})
	data.toolkeeper.decision.effect == "allow" with input as agent_call
}
