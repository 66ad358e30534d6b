# The trifecta rules of flows.yaml in Rego, for teams that decide with OPA: an egress call, in a session that
# has already seen untrusted content and private data, asks a person. toolkeeper labels each call first (the
# tool's own labels, and the label rules of the YAML file `--policy` names, such as flows.yaml), then queries
# data.toolkeeper.flows.decision with the policy input; the answer carries, beside effect, reason and rule,
# `flow`: the record ids of the calls that led to it (docs/reference/policy-input.md, input.session.seen).
# A team's own decision may use `flows_asks` beside its own rules (see the last lines).
package toolkeeper.flows

import rego.v1

# what a reason says a label stands for
words := {"untrusted": "untrusted content", "private": "private data", "egress": "data sent out"}

seen(label) := object.get(object.get(input, ["session", "seen"], {}), label, [])

has(label) if label in object.get(input, ["session", "has"], [])

has(label) if count(seen(label)) > 0

# The record ids of the calls that brought these labels, earliest first, each once.
flow(labels) := [id |
	some i, entry in calls(labels)
	id := entry[3]
	count([j | some j, other in calls(labels); j < i; other[3] == id]) == 0
]

calls(labels) := sort([[object.get(entry, "time", ""), l, e, object.get(entry, "record_id", "")] |
	some l, label in labels
	some e, entry in seen(label)
])

# (concat, not sprintf: regorus's sprintf drops the space after a %s)
said(labels) := concat(" and ", [concat(" from ", [words[label], concat(", ", tools(label))]) |
	some label in labels
])

tools(label) := {object.get(entry, "tool", "an earlier call") | some entry in seen(label)}

flows_asks contains {
	"effect": "ask",
	"rule": "flows-egress-after-untrusted-and-private",
	"reason": concat("", [
		"The call can send data out, and this session has already brought in content from outside ",
		"(which may carry instructions: a prompt injection) and read private data. A person confirms it first. ",
		"(this session has already seen ", said(["untrusted", "private"]), ")",
	]),
	"flow": flow(["untrusted", "private"]),
} if {
	"egress" in input.labels
	has("untrusted")
	has("private")
}

# The last two legs in one call: it reads private data and sends it, after content from outside.
flows_asks contains {
	"effect": "ask",
	"rule": "flows-private-egress-after-untrusted",
	"reason": concat("", [
		"The call reads private data and can send it out, and this session has already brought in content ",
		"from outside (which may carry instructions: a prompt injection). A person confirms it first. ",
		"(this session has already seen ", said(["untrusted"]), ")",
	]),
	"flow": flow(["untrusted"]),
} if {
	"egress" in input.labels
	"private" in input.labels
	has("untrusted")
}

default decision := {"effect": "allow", "rule": null, "reason": "no rule matched"}

# As the YAML rules combine: among asks, the first in the file (here: by rule id, which orders them so).
decision := sort_by_rule(flows_asks)[0] if count(flows_asks) > 0

sort_by_rule(asks) := [ask |
	some id in sort([a.rule | some a in asks])
	some ask in asks
	ask.rule == id
]
