# The default policy in Rego, for teams that run OPA: the same rules as
# default.yaml. toolkeeper queries data.toolkeeper.decision with the policy
# input (docs/reference/policy-input.md) and expects
#   {"effect": "allow" | "deny" | "ask", "reason": "...", "rule": "id" | null}
# "allow" means "no objection": yolo and the tiers still apply, and the most
# restrictive decision wins. An undefined decision is a deny (fail closed), so
# the default below must stay.
package toolkeeper

import rego.v1

credentials := `(^|/)(\.ssh/|id_(rsa|dsa|ecdsa|ed25519)(\.pub)?$|\.aws/credentials|\.netrc$|\.env$|shadow$)`

destructive_flags := `^(--force|--force-with-lease|--delete|--prune|--hard|--no-verify|-rf|-fr)(=|$)`

denies contains {
	"effect": "deny",
	"rule": "credentials-never",
	"reason": concat(" ", [
		"The call names a credential file (an SSH key, cloud or netrc credentials, a .env file, the password",
		"database). The default policy never lets a tool touch one; ask the user to do it by hand if it is",
		"really needed.",
	]),
} if {
	is_array(input.argv) # null for the agent's own tools: they have no argv
	some entry in input.argv
	regex.match(credentials, entry)
}

asks contains {
	"effect": "ask",
	"rule": "destructive-flags-ask",
	"reason": "The command carries a flag that destroys or skips a safety check.",
} if {
	is_array(input.argv)
	some entry in input.argv
	regex.match(destructive_flags, entry)
}

default decision := {"effect": "allow", "rule": null, "reason": "no rule matched"}

# The most restrictive wins: a deny, else an ask (the first by rule id among equals).
decision := sort(denies)[0] if count(denies) > 0

decision := sort(asks)[0] if {
	count(denies) == 0
	count(asks) > 0
}
