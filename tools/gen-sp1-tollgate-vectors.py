#!/usr/bin/env python3
"""Regenerate tests/data/sp1-tollgate/: Tollgate's own SP/1.0.1 decision vectors, in the
published vector format, with `canonical_hash` and `vector_hash` computed as the published
files define them (SHA-256 of json.dumps(..., sort_keys=True, separators=(",", ":"),
ensure_ascii=False, allow_nan=False) encoded as UTF-8; the vector hash over the vector
without its `vector_hash` key). The expectations are read off the SP/1.0.1 text (§3.2 rule 9,
§3.6); this script only writes them down and seals them. The Rust test suite checks every
seal, so it needs no Python. Run from the repository root."""
import hashlib
import json

OUT = "tests/data/sp1-tollgate/"
LICENSE = "Apache-2.0"
ATTRIBUTION = ("Tollgate project vectors, derived from the SP/1.0.1 specification text; "
               "same license as the project")
CANONICALIZATION = {
    "hash": "sha256",
    "serialization": "json, keys sorted ascending, separators (',',':'), UTF-8",
    "vector_hash": "sha256 of the canonical vector without its vector_hash key",
}


def canonical(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def sha256(value):
    return hashlib.sha256(canonical(value)).hexdigest()


def vector(name, pending, params, nonce, verdict, reason, note, seen=(), tool="wire_transfer",
           config=None):
    v = {
        "name": name,
        "config": config or {"budget_usd": 10.0, "max_repeat_calls": 5, "hitl_mode": "never"},
        "state": {
            "circuit_tripped": False,
            "seen_nonces": list(seen),
            "budget_initial_usd": 10.0,
            "budget_remaining_usd": 10.0,
            "pending_transition": pending,
        },
        "call": {"tool_name": tool, "params": params, "nonce": nonce},
        "canonical_hash": sha256(params),
        "expected_verdict": verdict,
        "expected_reason": reason,
        "conformance_note": note,
    }
    v["vector_hash"] = sha256(v)
    return v


def write(filename, description, fixtures):
    names = [f["name"] for f in fixtures]
    assert len(names) == len(set(names)), "duplicate vector names"
    doc = {
        "spec": "SP/1.0",
        "revision": "SP/1.0.1",
        "license": LICENSE,
        "attribution": ATTRIBUTION,
        "description": description,
        "canonicalization": CANONICALIZATION,
        "fixtures": fixtures,
    }
    with open(OUT + filename, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2, ensure_ascii=False)
        f.write("\n")


# ---------------------------------------------------------------------------------------
# §3.6 step 4: a terminal status bars an approve, never a modify's successor
# ---------------------------------------------------------------------------------------

ORIGINAL = {"amount": 500, "to": "acct_7"}
SUCCESSOR = {"amount": 200, "to": "acct_7"}
OTHER = {"amount": 300, "to": "acct_7"}
O_NONCE, S_NONCE = 7100, 7101


def modify(status, successor_nonce=S_NONCE, successor_digest=True, resume=False):
    p = {
        "decision": "modify",
        "original_nonce": O_NONCE,
        "original_args_digest": sha256(ORIGINAL),
        "terminal_status": status,
    }
    if successor_nonce is not None:
        p["successor_nonce"] = successor_nonce
    if successor_digest:
        p["successor_args_digest"] = sha256(SUCCESSOR)
    if resume:
        p["resume_attempt"] = True
    return p


RELEASE = ("ALLOW", "hitl_transition:modify_successor")
transitions = []
for status in ["consumed", "executed", "expired", "revoked", "cancelled", "rejected", "superseded",
               " EXPIRED "]:
    slug = status.strip().lower() + ("_spelled_loosely" if status != status.strip() else "")
    transitions.append(vector(
        f"modify_{slug}_successor_released", modify(status), SUCCESSOR, S_NONCE, *RELEASE,
        f"Terminal status `{status}` on a MODIFY describes the superseded original; §3.6 step 4 "
        "bars only an APPROVE with it, so the bound successor pair is still released."))
transitions += [
    vector("modify_consumed_original_nonce_superseded", modify("consumed"), ORIGINAL, O_NONCE,
           "DENY", "hitl_transition:superseded_original",
           "The original of a MODIFY tries to run: superseded, whatever the status says."),
    vector("modify_expired_original_nonce_successor_args_superseded", modify("expired"),
           SUCCESSOR, O_NONCE, "DENY", "hitl_transition:superseded_original",
           "The original's nonce carrying the successor's arguments is still the original."),
    vector("modify_consumed_other_nonce", modify("consumed"), SUCCESSOR, 7102,
           "DENY", "hitl_transition:nonce_mismatch",
           "Successor arguments under a nonce that is neither bound one: §3.6 step 6."),
    vector("modify_expired_successor_nonce_original_args", modify("expired"), ORIGINAL, S_NONCE,
           "DENY", "hitl_transition:digest_mismatch",
           "The successor's nonce with the original's arguments: the digest does not match."),
    vector("modify_revoked_successor_nonce_other_args", modify("revoked"), OTHER, S_NONCE,
           "DENY", "hitl_transition:digest_mismatch",
           "The successor's nonce with arguments no one approved."),
    vector("modify_consumed_unbound", modify("consumed", None, False), SUCCESSOR, S_NONCE,
           "DENY", "hitl_transition:unbound_authorization",
           "A MODIFY binding neither successor nonce nor digest authorizes nothing: §3.6 step 5."),
    vector("modify_superseded_unbound", modify("superseded", None, False), SUCCESSOR, 7102,
           "DENY", "hitl_transition:unbound_authorization",
           "Unbound under the ordinary `superseded` status too."),
    vector("modify_executed_unbound_original_superseded_first", modify("executed", None, False),
           ORIGINAL, O_NONCE, "DENY", "hitl_transition:superseded_original",
           "Step 4 (the original is superseded) is checked before step 5 (unbound)."),
    vector("modify_consumed_nonce_only_binding", modify("consumed", S_NONCE, False), OTHER,
           S_NONCE, *RELEASE,
           "Only the successor nonce is bound, so only the nonce is compared."),
    vector("modify_expired_digest_only_binding", modify("expired", None, True), SUCCESSOR, 7103,
           *RELEASE, "Only the successor digest is bound, so only the digest is compared."),
    vector("modify_consumed_resume_attempt", modify("consumed", resume=True), SUCCESSOR, S_NONCE,
           "DENY", "policy_violation:duplicate_resume_no_effect",
           "§3.6 step 2 precedes step 4: a resume of a terminal transition has no effect, even "
           "for the successor pair."),
    vector("modify_superseded_resume_attempt", modify("superseded", resume=True), SUCCESSOR,
           S_NONCE, "DENY", "policy_violation:duplicate_resume_no_effect",
           "Step 2 with the ordinary `superseded` status."),
    vector("modify_pending_resume_attempt_resolves", modify("pending", resume=True), SUCCESSOR,
           S_NONCE, *RELEASE,
           "Step 2 needs a terminal status; a resume of a pending MODIFY resolves normally."),
    vector("modify_consumed_successor_nonce_already_seen", modify("consumed"), SUCCESSOR, S_NONCE,
           "DENY", "policy_violation:duplicate_resume_no_effect",
           "A successor nonce that already ran is refused by rule 3 (anti-replay) before the "
           "transition is resolved.", seen=[S_NONCE]),
    vector("approve_expired_terminal_no_effect",
           {"decision": "approve", "original_nonce": O_NONCE,
            "original_args_digest": sha256(ORIGINAL), "terminal_status": "expired"},
           ORIGINAL, O_NONCE, "DENY", "hitl_transition:terminal_no_effect",
           "Control: for an APPROVE a terminal status does bar the release."),
]
write("transition-modify-terminal.json",
      "Tollgate's own vectors for SP/1.0.1 §3.6 step 4: a terminal_status bars only an "
      "approve; a modify still releases exactly its bound successor, and every other call "
      "gets the step 4-6 refusal.",
      transitions)

# ---------------------------------------------------------------------------------------
# §3.2 rule 9: opaque context is a key-class × value-class product
# ---------------------------------------------------------------------------------------

HELD = ("HITL", "fail_closed:opaque_context")
FREE = ("ALLOW", "within_thresholds")
opaque_cases = [
    ("ctx_list_number_and_marker", {"ctx": [42, "unknown"]}, FREE,
     "A list under a context key is not a marker, and a bare string inside it is no binding."),
    ("ctx_list_object_with_marker", {"ctx": [{"context": "opaque"}]}, HELD,
     "Objects inside a list under a context key are walked: `context` holds a marker."),
    ("opaque_key_list_with_marker", {"opaque": ["x", "unknown"]}, FREE,
     "The key `opaque` is context-bearing; its value is a list, which is walked, not matched."),
    ("context_list_single_marker", {"context": ["opaque"]}, FREE,
     "A one-element list holding a marker is still a list."),
    ("ctx_nested_list_marker", {"ctx": [["unknown"]]}, FREE,
     "Lists inside lists: still no binding."),
    ("ctx_nested_list_object_marker", {"ctx": [[{"context": "unknown"}]]}, HELD,
     "An object two lists deep is walked."),
    ("plain_key_list_object_marker", {"items": [{"a": 1}, {"blob": "untestable"}]}, HELD,
     "A context key inside an object inside a list under an ordinary key."),
    ("ctx_object_with_context_key_marker", {"ctx": {"raw_context": "unevaluable"}}, HELD,
     "An object under a context key is walked for context keys."),
    ("ctx_object_with_plain_key_marker", {"ctx": {"note": "opaque"}}, FREE,
     "A marker under an ordinary key, even inside a context key's object, binds nothing."),
    ("deep_object_list_marker", {"a": {"b": {"c": [{"d": {"blob": "UNTESTABLE"}}]}}}, HELD,
     "Context keys count at any depth."),
    ("key_and_marker_with_whitespace_and_case", {" Context ": "  OPAQUE  "}, HELD,
     "Keys and markers match after trimming, in any case."),
    ("marker_with_tab", {"CTX": "Unknown\t"}, HELD, "Trailing whitespace includes a tab."),
    ("opaque_key_opaque_marker", {"opaque": "opaque"}, HELD,
     "`opaque` is both a context key and a marker."),
    ("non_marker_string_containing_marker", {"context": "opaque context"}, FREE,
     "A sentence that contains a marker word is not the marker."),
    ("marker_prefix_string", {"ctx": "unknownish"}, FREE, "Markers match whole."),
    ("empty_string", {"ctx": ""}, FREE, "An empty string is evaluable."),
    ("number", {"ctx": 42}, FREE, "A number is evaluable."),
    ("fraction", {"ctx": 0.5}, FREE, "A fraction is evaluable."),
    ("null", {"ctx": None}, FREE, "null is evaluable."),
    ("boolean", {"context": True}, FREE, "A boolean is evaluable."),
    ("empty_object", {"ctx": {}}, FREE, "An empty object holds no binding."),
    ("empty_list", {"blob": []}, FREE, "An empty list holds no binding."),
    ("marker_under_plain_key", {"note": "opaque"}, FREE,
     "A marker under an ordinary key binds nothing."),
    ("near_miss_key", {"contexts": "opaque"}, FREE, "Only the five context keys count."),
]
opaque = [
    vector(f"opaque_{name}", None, {**params, "tool": "click"}, 7200 + i, *want, note,
           tool="click")
    for i, (name, params, want, note) in enumerate(opaque_cases)
]
opaque.append(vector(
    "opaque_after_hitl_always", None, {"ctx": "opaque", "tool": "click"}, 7299,
    "HITL", "hitl_all_calls",
    "Rule order: hitl_mode always (rule 7) answers before opaque context (rule 9).",
    tool="click", config={"budget_usd": 10.0, "max_repeat_calls": 5, "hitl_mode": "always"}))
write("opaque-context.json",
      "Tollgate's own vectors for SP/1.0.1 §3.2 rule 9: a context-bearing key is opaque when "
      "its own value is a marker string; lists and objects under it are walked for nested "
      "context keys, and a bare string inside a list is no binding.",
      opaque)

# ---------------------------------------------------------------------------------------
# Tollgate's extension of §3.6: several held calls, each its own transition
# (`config.max_held_calls` above 1; `state.held_transitions` are the held calls after the
# oldest, which is `pending_transition`). Not SP/1.0.1: the specification has one.
# ---------------------------------------------------------------------------------------

PAY = [{"amount": 10 + i, "to": f"acct_{i}"} for i in range(4)]
EDIT = {"amount": 1, "to": "acct_3"}
P_NONCE = [7300 + i for i in range(4)]
P_SUCC = 7399


def held(i, decision="", status="pending", successor=False):
    p = {"decision": decision, "original_nonce": P_NONCE[i],
         "original_args_digest": sha256(PAY[i]), "terminal_status": status}
    if successor:
        p["successor_nonce"] = P_SUCC
        p["successor_args_digest"] = sha256(EDIT)
    return p


HELD = [held(0), held(1, "approve"), held(2, "reject", "rejected"),
        held(3, "modify", "superseded", successor=True)]


def parallel_vector(name, params, nonce, verdict, reason, note, max_held=16, mode="always",
                    seen=(), transitions=HELD):
    v = {
        "name": name,
        "config": {"budget_usd": 10.0, "max_repeat_calls": 5, "hitl_mode": mode,
                   "max_held_calls": max_held},
        "state": {
            "circuit_tripped": False,
            "seen_nonces": list(seen),
            "budget_initial_usd": 10.0,
            "budget_remaining_usd": 10.0,
            "status": "paused",
            "pending_transition": transitions[0],
            "held_transitions": transitions[1:],
        },
        "call": {"tool_name": "pay", "params": params},
        "canonical_hash": sha256(params),
        "expected_verdict": verdict,
        "expected_reason": reason,
        "conformance_note": note,
    }
    if nonce is not None:
        v["call"]["nonce"] = nonce
    v["vector_hash"] = sha256(v)
    return v


parallel = [
    parallel_vector("held_second_approved_released", PAY[1], P_NONCE[1],
                    "ALLOW", "hitl_transition:approve",
                    "The call names the second held call, approved: released, although the "
                    "oldest still awaits a human."),
    parallel_vector("held_oldest_awaiting_still_held", PAY[0], P_NONCE[0],
                    "HITL", "hitl_transition:defer_escalate",
                    "The oldest held call, asked again before anyone decided: still held."),
    parallel_vector("held_new_call_is_decided_by_the_rules", {"amount": 5, "to": "acct_9"}, 7390,
                    "HITL", "hitl_all_calls",
                    "A nonce naming no held call is a new call: rules 5 to 10 decide it (here "
                    "hitl_mode always), instead of a nonce mismatch against the oldest."),
    parallel_vector("held_new_call_allowed_beside_held_ones", {"amount": 5, "to": "acct_9"},
                    7390, "ALLOW", "within_thresholds",
                    "With hitl_mode never, a new call runs while other calls wait for a human.",
                    mode="never"),
    parallel_vector("held_rejected_denied", PAY[2], P_NONCE[2],
                    "DENY", "hitl_transition:reject",
                    "A rejected held call dispatched again: §3.6 step 3 against its own "
                    "transition."),
    parallel_vector("held_modified_successor_released", EDIT, P_SUCC,
                    "ALLOW", "hitl_transition:modify_successor",
                    "The successor a human gave the fourth held call: released."),
    parallel_vector("held_modified_original_superseded", PAY[3], P_NONCE[3],
                    "DENY", "hitl_transition:superseded_original",
                    "The original of the modified held call: superseded."),
    parallel_vector("held_approved_nonce_other_args", PAY[0], P_NONCE[1],
                    "DENY", "hitl_transition:digest_mismatch",
                    "The approved call's nonce with another held call's arguments."),
    parallel_vector("held_nonceless_call_answers_to_the_oldest", PAY[1], None,
                    "HITL", "hitl_transition:defer_escalate",
                    "A call without a nonce cannot name a held call: it answers to the oldest "
                    "transition, as in SP/1.0.1."),
    parallel_vector("held_consumed_release_replayed", PAY[1], P_NONCE[1],
                    "DENY", "policy_violation:duplicate_resume_no_effect",
                    "A seen nonce naming a held call whose transition is terminal: rule 3 "
                    "reports a resume with no effect (that transition's status, not the "
                    "oldest's).",
                    seen=[P_NONCE[1]],
                    transitions=[held(0), held(1, "approve", "consumed")]),
    parallel_vector("one_transition_second_approved_not_read", PAY[1], P_NONCE[1],
                    "HITL", "hitl_transition:defer_escalate",
                    "max_held_calls 1 is SP/1.0.1 exactly: only the oldest transition is read, "
                    "and it awaits a human.", max_held=1),
    parallel_vector("one_transition_new_call_nonce_mismatch", {"amount": 5, "to": "acct_9"}, 7390,
                    "HITL", "hitl_transition:defer_escalate",
                    "max_held_calls 1: a new call while the oldest awaits a human is held "
                    "behind it.", max_held=1),
    parallel_vector("one_transition_replay_reports_the_oldest", PAY[1], P_NONCE[1],
                    "DENY", "policy_violation:duplicate_nonce",
                    "max_held_calls 1: rule 3 reads the oldest transition, which is not "
                    "terminal.", max_held=1, seen=[P_NONCE[1]],
                    transitions=[held(0), held(1, "approve", "consumed")]),
]
write("parallel-holds.json",
      "Tollgate's own vectors for its extension of SP/1.0.1 §3.6 (config max_held_calls above "
      "1): several held calls, each its own transition bound to its nonce; "
      "state.held_transitions are the held calls after the oldest (pending_transition).",
      parallel)
