//! Every rule id the gate reports, with the requirement it checks.
//!
//! The ids are stable: they are what a record-set author greps for, what fixtures are named
//! after and what `tollgate board check` prints. Their requirements are paraphrased from the
//! "Rules checked by the gate" tables of the four references (risk-tier-crosswalk.md has no
//! table of its own; its tiers are checked through the HO-MONO-TIER and DR-* rules).

use std::fmt;

/// A rule id. `Display` and [`RuleId::as_str`] give the id as printed (`HO-SCHEMA`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RuleId {
    /// `HO-SCHEMA`: The record set is strict JSON and every envelope matches the shipped schema (shape only, ECMA-262 patterns).
    HoSchema,
    /// `HO-ROOT-PARENT`: parent_task_id is null exactly when hop_count is 0.
    HoRootParent,
    /// `HO-NO-SELF-ADDRESS`: Source and destination are different parties (agent id or principal subject).
    HoNoSelfAddress,
    /// `HO-NO-EXECUTION`: authorized_actions only holds read, analyze, recommend, challenge and escalate.
    HoNoExecution,
    /// `HO-AGENT-NO-APPROVAL`: An envelope from an agent has approval_state not-required or pending-human-review.
    HoAgentNoApproval,
    /// `HO-APPROVAL-ONLY-ON-RECORD`: A principal's envelope that is not a decision-record has approval_state not-required or pending-human-review.
    HoApprovalOnlyOnRecord,
    /// `HO-ESCALATE-TO-PRINCIPAL`: An escalate envelope, or any envelope with status escalated, goes to a principal.
    HoEscalateToPrincipal,
    /// `HO-PAYLOAD-RETURN`: A return carries a verdict.
    HoPayloadReturn,
    /// `HO-PAYLOAD-CHALLENGE`: A challenge carries a challenge payload.
    HoPayloadChallenge,
    /// `HO-PAYLOAD-ESCALATE`: An escalate carries an escalation.
    HoPayloadEscalate,
    /// `HO-PAYLOAD-DECISION-REQUEST`: A decision-request carries a decision_request.
    HoPayloadDecisionRequest,
    /// `HO-PAYLOAD-DECISION-RECORD`: A decision-record carries a decision_record.
    HoPayloadDecisionRecord,
    /// `HO-PAYLOAD-EXCLUSIVE`: No envelope carries the payload of another message type (a delegate carries none).
    HoPayloadExclusive,
    /// `HO-STOPPED-HAS-REASON`: Status stopped comes with at least one stop reason.
    HoStoppedHasReason,
    /// `HO-REASON-HAS-STATUS`: A stop reason needs status stopped or escalated.
    HoReasonHasStatus,
    /// `HO-STOP-NOTE`: Declaring conflicting-instructions needs a stop_note.
    HoStopNote,
    /// `HO-BLOCK-AS-CHALLENGE`: A return addressed to an agent never has verdict block; adverse findings between agents are challenges.
    HoBlockAsChallenge,
    /// `HO-RETURN-EVIDENCE`: A non-block return cites evidence not labelled inference and declares no blocking missing evidence.
    HoReturnEvidence,
    /// `HO-DESTINATION-TIER`: An agent destination is in the catalog with execution tier static-review or read-only-runtime.
    HoDestinationTier,
    /// `HO-UNIQUE-TASK-ID`: No two envelopes share a task_id.
    HoUniqueTaskId,
    /// `HO-ONE-CORRELATION`: Every envelope has the same correlation_id.
    HoOneCorrelation,
    /// `HO-ONE-ROOT`: Exactly one envelope has hop_count 0.
    HoOneRoot,
    /// `HO-CHAIN-PARENT`: A non-root envelope's parent is in the record set and its hop_count is the parent's plus one.
    HoChainParent,
    /// `HO-CHAIN-TIME`: No envelope is sent before its parent.
    HoChainTime,
    /// `HO-CHAIN-CUSTODY`: An envelope comes from its parent's destination, or from its parent's sender when the parent stopped.
    HoChainCustody,
    /// `HO-RETURN-TO-SENDER`: A return goes to its parent's sender or to the sender of an earlier delegate in its chain that was addressed to the return's sender.
    HoReturnToSender,
    /// `HO-ATTEN-ACTIONS`: authorized_actions never widen from parent to child.
    HoAttenActions,
    /// `HO-ATTEN-BUDGET`: Budget limits never rise from parent to child and the currency never changes.
    HoAttenBudget,
    /// `HO-MONO-TIER`: subject_risk_tier never falls from parent to child.
    HoMonoTier,
    /// `HO-MONO-CLASS`: data_classification never falls from parent to child.
    HoMonoClass,
    /// `HO-MONO-MATERIALITY`: No materiality flag is dropped from parent to child.
    HoMonoMateriality,
    /// `HO-MONO-PROHIBITIONS`: No do_not_do_list item is dropped from parent to child.
    HoMonoProhibitions,
    /// `HO-MONO-DEADLINE`: The deadline never moves later from parent to child.
    HoMonoDeadline,
    /// `HO-MONO-MAX-HOPS`: max_hops never rises from parent to child.
    HoMonoMaxHops,
    /// `HO-MONO-SPENT`: Spent counters never fall from parent to child.
    HoMonoSpent,
    /// `CH-PROPOSAL-LINK`: A challenge's proposal_task_id names an envelope in the record set that precedes the challenge.
    ChProposalLink,
    /// `CH-ROUND-COUNTED`: A challenge's round equals the counted exchanges (not stopped) from its target's sender to the challenger before it, at least 1.
    ChRoundCounted,
    /// `DR-TO-PRINCIPAL`: A decision-request goes to a principal.
    DrToPrincipal,
    /// `DR-PROPOSER-IS-SENDER`: A decision-request comes from the agent it names as proposer_agent.
    DrProposerIsSender,
    /// `DR-CHALLENGE-TARGETS-PROPOSAL`: Every attached challenge that is not a HARD gate targets an envelope sent by the proposer.
    DrChallengeTargetsProposal,
    /// `DR-CHALLENGE-RESOLVES`: Every challenge_task_ids entry names a challenge envelope in the record set.
    DrChallengeResolves,
    /// `DR-CHALLENGE-PRECEDES`: No attached challenge is sent after the request or descends from it.
    DrChallengePrecedes,
    /// `DR-CHALLENGE-COMPLETE`: Every challenge on the proposer's envelopes and every HARD gate that precedes the request (and, in force, its records) is attached.
    DrChallengeComplete,
    /// `DR-RISK-CARRIED`: A request's tier and flags are at least those of every envelope not causally after it (and, in force, after its records).
    DrRiskCarried,
    /// `DR-ONE-REQUEST`: One request in force: every other supersedes an earlier request of the same proposer, none twice, with no cycle.
    DrOneRequest,
    /// `DR-OWNER-FROM-ROOT`: A correlation with a request opens with a principal root naming another principal as decision_owner, and requests go to that owner.
    DrOwnerFromRoot,
    /// `DR-CLASS-FROM-ROOT`: A request's decision_class is the one the root declared.
    DrClassFromRoot,
    /// `DR-CHALLENGE-REQUIRED`: At R2 or above, with any materiality flag, or for automation-investment, a challenge is attached.
    DrChallengeRequired,
    /// `DR-DESIGNATED-CHALLENGER`: When a challenge is required, the class's designated challenger attached a completed (or round-capped) challenge of the proposer's envelopes.
    DrDesignatedChallenger,
    /// `DR-PROPOSER-NOT-CHALLENGER`: No attached challenge was sent by the proposer.
    DrProposerNotChallenger,
    /// `DR-ALTERNATIVES`: When a challenge is required, at least one alternative is recorded.
    DrAlternatives,
    /// `DR-UNRESOLVED-DISSENT`: Every attached open challenge has a dissent entry.
    DrUnresolvedDissent,
    /// `DR-NO-APPROVE-OVER-DISSENT`: With any attached challenge open, the recommendation is not approve; with an attached HARD gate open, not conditional-approve either.
    DrNoApproveOverDissent,
    /// `DR-HARD-GATE`: With an attached HARD gate open, the recommendation is reject, redesign or escalate.
    DrHardGate,
    /// `DR-VALUE-CASE-REQUIRED`: An automation-investment request carries a value_case.
    DrValueCaseRequired,
    /// `DRC-PRINCIPAL-SOURCE`: A decision-record comes from a principal.
    DrcPrincipalSource,
    /// `DRC-DECIDER-IS-SENDER`: decided_by is the record's own sender, whoever sent the record.
    DrcDeciderIsSender,
    /// `DRC-REQUEST-BINDING`: request_task_id names a decision-request and request_digest is its canonical digest.
    DrcRequestBinding,
    /// `DRC-NOT-REQUESTER`: Neither decider nor second approver is the principal who opened the correlation.
    DrcNotRequester,
    /// `DRC-DECIDER-IS-ADDRESSEE`: A decider's record is decided by the principal the request was addressed to.
    DrcDeciderIsAddressee,
    /// `DRC-AFTER-REQUEST`: A record is not sent before its request, and the request does not descend from it.
    DrcAfterRequest,
    /// `DRC-ONE-RECORD`: A request has at most one decider's record, and that record at most one co-signing record.
    DrcOneRecord,
    /// `DRC-COMPLETED`: A decision-record has status completed.
    DrcCompleted,
    /// `DRC-SECOND-APPROVER`: A decider's record at R5, or on an R5 request, names a second approver other than the decider.
    DrcSecondApprover,
    /// `DRC-CO-SIGNED`: The in-force decider's record that names a second approver is co-signed by that principal's own record.
    DrcCoSigned,
    /// `DRC-CO-SIGN-BINDING`: A co-signing record matches its decider's record (request, digest, outcome), comes from its second approver, descends from it, and names no second approver.
    DrcCoSignBinding,
    /// `DRC-HARD-GATE-ACCEPTANCE`: Approving over an open attached HARD gate needs risk_acceptance_ref.
    DrcHardGateAcceptance,
    /// `DRC-APPROVAL-STATE`: approval_state is approved for approve or conditional-approve and rejected for reject or redesign.
    DrcApprovalState,
    /// `STOP-DEPTH`: A delegate at hop_count >= max_hops declares delegation-depth-exceeded and is stopped or escalated.
    StopDepth,
    /// `STOP-DEADLINE`: An envelope sent after its deadline declares deadline-passed and is stopped or escalated.
    StopDeadline,
    /// `STOP-BUDGET`: An exhausted budget (delegate: spent >= limit; others: spent > limit) declares budget-exhausted and is stopped or escalated.
    StopBudget,
    /// `STOP-MISSING-EVIDENCE`: A delegate or decision-request with blocking missing evidence declares missing-evidence and is stopped or escalated.
    StopMissingEvidence,
    /// `STOP-LIVE-GUARD`: A delegate whose objective opens with a mutation verb declares live-guard-intent and is stopped or escalated.
    StopLiveGuard,
    /// `STOP-INSTRUCTION-BAIT`: An objective with override or claimed-approval bait declares conflicting-instructions and is stopped or escalated.
    StopInstructionBait,
    /// `STOP-ROUTING-LOOP`: An agent's delegate to an agent already delegated to in its chain declares routing-loop, unless it is the one allowed revisit.
    StopRoutingLoop,
    /// `STOP-TERMINAL`: Every child of a stopped envelope is an escalate, and no decision-record binds a request that declares a stop.
    StopTerminal,
    /// `STOP-CHALLENGE-ROUNDS`: A challenge past round 2 declares challenge-rounds-exceeded and is stopped or escalated.
    StopChallengeRounds,
}

impl RuleId {
    /// Every rule id, in the order of the references' tables.
    pub const ALL: [RuleId; 77] = [
        RuleId::HoSchema,
        RuleId::HoRootParent,
        RuleId::HoNoSelfAddress,
        RuleId::HoNoExecution,
        RuleId::HoAgentNoApproval,
        RuleId::HoApprovalOnlyOnRecord,
        RuleId::HoEscalateToPrincipal,
        RuleId::HoPayloadReturn,
        RuleId::HoPayloadChallenge,
        RuleId::HoPayloadEscalate,
        RuleId::HoPayloadDecisionRequest,
        RuleId::HoPayloadDecisionRecord,
        RuleId::HoPayloadExclusive,
        RuleId::HoStoppedHasReason,
        RuleId::HoReasonHasStatus,
        RuleId::HoStopNote,
        RuleId::HoBlockAsChallenge,
        RuleId::HoReturnEvidence,
        RuleId::HoDestinationTier,
        RuleId::HoUniqueTaskId,
        RuleId::HoOneCorrelation,
        RuleId::HoOneRoot,
        RuleId::HoChainParent,
        RuleId::HoChainTime,
        RuleId::HoChainCustody,
        RuleId::HoReturnToSender,
        RuleId::HoAttenActions,
        RuleId::HoAttenBudget,
        RuleId::HoMonoTier,
        RuleId::HoMonoClass,
        RuleId::HoMonoMateriality,
        RuleId::HoMonoProhibitions,
        RuleId::HoMonoDeadline,
        RuleId::HoMonoMaxHops,
        RuleId::HoMonoSpent,
        RuleId::ChProposalLink,
        RuleId::ChRoundCounted,
        RuleId::DrToPrincipal,
        RuleId::DrProposerIsSender,
        RuleId::DrChallengeTargetsProposal,
        RuleId::DrChallengeResolves,
        RuleId::DrChallengePrecedes,
        RuleId::DrChallengeComplete,
        RuleId::DrRiskCarried,
        RuleId::DrOneRequest,
        RuleId::DrOwnerFromRoot,
        RuleId::DrClassFromRoot,
        RuleId::DrChallengeRequired,
        RuleId::DrDesignatedChallenger,
        RuleId::DrProposerNotChallenger,
        RuleId::DrAlternatives,
        RuleId::DrUnresolvedDissent,
        RuleId::DrNoApproveOverDissent,
        RuleId::DrHardGate,
        RuleId::DrValueCaseRequired,
        RuleId::DrcPrincipalSource,
        RuleId::DrcDeciderIsSender,
        RuleId::DrcRequestBinding,
        RuleId::DrcNotRequester,
        RuleId::DrcDeciderIsAddressee,
        RuleId::DrcAfterRequest,
        RuleId::DrcOneRecord,
        RuleId::DrcCompleted,
        RuleId::DrcSecondApprover,
        RuleId::DrcCoSigned,
        RuleId::DrcCoSignBinding,
        RuleId::DrcHardGateAcceptance,
        RuleId::DrcApprovalState,
        RuleId::StopDepth,
        RuleId::StopDeadline,
        RuleId::StopBudget,
        RuleId::StopMissingEvidence,
        RuleId::StopLiveGuard,
        RuleId::StopInstructionBait,
        RuleId::StopRoutingLoop,
        RuleId::StopTerminal,
        RuleId::StopChallengeRounds,
    ];

    /// The id as printed.
    pub fn as_str(self) -> &'static str {
        match self {
            RuleId::HoSchema => "HO-SCHEMA",
            RuleId::HoRootParent => "HO-ROOT-PARENT",
            RuleId::HoNoSelfAddress => "HO-NO-SELF-ADDRESS",
            RuleId::HoNoExecution => "HO-NO-EXECUTION",
            RuleId::HoAgentNoApproval => "HO-AGENT-NO-APPROVAL",
            RuleId::HoApprovalOnlyOnRecord => "HO-APPROVAL-ONLY-ON-RECORD",
            RuleId::HoEscalateToPrincipal => "HO-ESCALATE-TO-PRINCIPAL",
            RuleId::HoPayloadReturn => "HO-PAYLOAD-RETURN",
            RuleId::HoPayloadChallenge => "HO-PAYLOAD-CHALLENGE",
            RuleId::HoPayloadEscalate => "HO-PAYLOAD-ESCALATE",
            RuleId::HoPayloadDecisionRequest => "HO-PAYLOAD-DECISION-REQUEST",
            RuleId::HoPayloadDecisionRecord => "HO-PAYLOAD-DECISION-RECORD",
            RuleId::HoPayloadExclusive => "HO-PAYLOAD-EXCLUSIVE",
            RuleId::HoStoppedHasReason => "HO-STOPPED-HAS-REASON",
            RuleId::HoReasonHasStatus => "HO-REASON-HAS-STATUS",
            RuleId::HoStopNote => "HO-STOP-NOTE",
            RuleId::HoBlockAsChallenge => "HO-BLOCK-AS-CHALLENGE",
            RuleId::HoReturnEvidence => "HO-RETURN-EVIDENCE",
            RuleId::HoDestinationTier => "HO-DESTINATION-TIER",
            RuleId::HoUniqueTaskId => "HO-UNIQUE-TASK-ID",
            RuleId::HoOneCorrelation => "HO-ONE-CORRELATION",
            RuleId::HoOneRoot => "HO-ONE-ROOT",
            RuleId::HoChainParent => "HO-CHAIN-PARENT",
            RuleId::HoChainTime => "HO-CHAIN-TIME",
            RuleId::HoChainCustody => "HO-CHAIN-CUSTODY",
            RuleId::HoReturnToSender => "HO-RETURN-TO-SENDER",
            RuleId::HoAttenActions => "HO-ATTEN-ACTIONS",
            RuleId::HoAttenBudget => "HO-ATTEN-BUDGET",
            RuleId::HoMonoTier => "HO-MONO-TIER",
            RuleId::HoMonoClass => "HO-MONO-CLASS",
            RuleId::HoMonoMateriality => "HO-MONO-MATERIALITY",
            RuleId::HoMonoProhibitions => "HO-MONO-PROHIBITIONS",
            RuleId::HoMonoDeadline => "HO-MONO-DEADLINE",
            RuleId::HoMonoMaxHops => "HO-MONO-MAX-HOPS",
            RuleId::HoMonoSpent => "HO-MONO-SPENT",
            RuleId::ChProposalLink => "CH-PROPOSAL-LINK",
            RuleId::ChRoundCounted => "CH-ROUND-COUNTED",
            RuleId::DrToPrincipal => "DR-TO-PRINCIPAL",
            RuleId::DrProposerIsSender => "DR-PROPOSER-IS-SENDER",
            RuleId::DrChallengeTargetsProposal => "DR-CHALLENGE-TARGETS-PROPOSAL",
            RuleId::DrChallengeResolves => "DR-CHALLENGE-RESOLVES",
            RuleId::DrChallengePrecedes => "DR-CHALLENGE-PRECEDES",
            RuleId::DrChallengeComplete => "DR-CHALLENGE-COMPLETE",
            RuleId::DrRiskCarried => "DR-RISK-CARRIED",
            RuleId::DrOneRequest => "DR-ONE-REQUEST",
            RuleId::DrOwnerFromRoot => "DR-OWNER-FROM-ROOT",
            RuleId::DrClassFromRoot => "DR-CLASS-FROM-ROOT",
            RuleId::DrChallengeRequired => "DR-CHALLENGE-REQUIRED",
            RuleId::DrDesignatedChallenger => "DR-DESIGNATED-CHALLENGER",
            RuleId::DrProposerNotChallenger => "DR-PROPOSER-NOT-CHALLENGER",
            RuleId::DrAlternatives => "DR-ALTERNATIVES",
            RuleId::DrUnresolvedDissent => "DR-UNRESOLVED-DISSENT",
            RuleId::DrNoApproveOverDissent => "DR-NO-APPROVE-OVER-DISSENT",
            RuleId::DrHardGate => "DR-HARD-GATE",
            RuleId::DrValueCaseRequired => "DR-VALUE-CASE-REQUIRED",
            RuleId::DrcPrincipalSource => "DRC-PRINCIPAL-SOURCE",
            RuleId::DrcDeciderIsSender => "DRC-DECIDER-IS-SENDER",
            RuleId::DrcRequestBinding => "DRC-REQUEST-BINDING",
            RuleId::DrcNotRequester => "DRC-NOT-REQUESTER",
            RuleId::DrcDeciderIsAddressee => "DRC-DECIDER-IS-ADDRESSEE",
            RuleId::DrcAfterRequest => "DRC-AFTER-REQUEST",
            RuleId::DrcOneRecord => "DRC-ONE-RECORD",
            RuleId::DrcCompleted => "DRC-COMPLETED",
            RuleId::DrcSecondApprover => "DRC-SECOND-APPROVER",
            RuleId::DrcCoSigned => "DRC-CO-SIGNED",
            RuleId::DrcCoSignBinding => "DRC-CO-SIGN-BINDING",
            RuleId::DrcHardGateAcceptance => "DRC-HARD-GATE-ACCEPTANCE",
            RuleId::DrcApprovalState => "DRC-APPROVAL-STATE",
            RuleId::StopDepth => "STOP-DEPTH",
            RuleId::StopDeadline => "STOP-DEADLINE",
            RuleId::StopBudget => "STOP-BUDGET",
            RuleId::StopMissingEvidence => "STOP-MISSING-EVIDENCE",
            RuleId::StopLiveGuard => "STOP-LIVE-GUARD",
            RuleId::StopInstructionBait => "STOP-INSTRUCTION-BAIT",
            RuleId::StopRoutingLoop => "STOP-ROUTING-LOOP",
            RuleId::StopTerminal => "STOP-TERMINAL",
            RuleId::StopChallengeRounds => "STOP-CHALLENGE-ROUNDS",
        }
    }

    /// The one-line requirement.
    pub fn requirement(self) -> &'static str {
        match self {
            RuleId::HoSchema => "The record set is strict JSON and every envelope matches the shipped schema (shape only, ECMA-262 patterns).",
            RuleId::HoRootParent => "parent_task_id is null exactly when hop_count is 0.",
            RuleId::HoNoSelfAddress => "Source and destination are different parties (agent id or principal subject).",
            RuleId::HoNoExecution => "authorized_actions only holds read, analyze, recommend, challenge and escalate.",
            RuleId::HoAgentNoApproval => "An envelope from an agent has approval_state not-required or pending-human-review.",
            RuleId::HoApprovalOnlyOnRecord => "A principal's envelope that is not a decision-record has approval_state not-required or pending-human-review.",
            RuleId::HoEscalateToPrincipal => "An escalate envelope, or any envelope with status escalated, goes to a principal.",
            RuleId::HoPayloadReturn => "A return carries a verdict.",
            RuleId::HoPayloadChallenge => "A challenge carries a challenge payload.",
            RuleId::HoPayloadEscalate => "An escalate carries an escalation.",
            RuleId::HoPayloadDecisionRequest => "A decision-request carries a decision_request.",
            RuleId::HoPayloadDecisionRecord => "A decision-record carries a decision_record.",
            RuleId::HoPayloadExclusive => "No envelope carries the payload of another message type (a delegate carries none).",
            RuleId::HoStoppedHasReason => "Status stopped comes with at least one stop reason.",
            RuleId::HoReasonHasStatus => "A stop reason needs status stopped or escalated.",
            RuleId::HoStopNote => "Declaring conflicting-instructions needs a stop_note.",
            RuleId::HoBlockAsChallenge => "A return addressed to an agent never has verdict block; adverse findings between agents are challenges.",
            RuleId::HoReturnEvidence => "A non-block return cites evidence not labelled inference and declares no blocking missing evidence.",
            RuleId::HoDestinationTier => "An agent destination is in the catalog with execution tier static-review or read-only-runtime.",
            RuleId::HoUniqueTaskId => "No two envelopes share a task_id.",
            RuleId::HoOneCorrelation => "Every envelope has the same correlation_id.",
            RuleId::HoOneRoot => "Exactly one envelope has hop_count 0.",
            RuleId::HoChainParent => "A non-root envelope's parent is in the record set and its hop_count is the parent's plus one.",
            RuleId::HoChainTime => "No envelope is sent before its parent.",
            RuleId::HoChainCustody => "An envelope comes from its parent's destination, or from its parent's sender when the parent stopped.",
            RuleId::HoReturnToSender => "A return goes to its parent's sender or to the sender of an earlier delegate in its chain that was addressed to the return's sender.",
            RuleId::HoAttenActions => "authorized_actions never widen from parent to child.",
            RuleId::HoAttenBudget => "Budget limits never rise from parent to child and the currency never changes.",
            RuleId::HoMonoTier => "subject_risk_tier never falls from parent to child.",
            RuleId::HoMonoClass => "data_classification never falls from parent to child.",
            RuleId::HoMonoMateriality => "No materiality flag is dropped from parent to child.",
            RuleId::HoMonoProhibitions => "No do_not_do_list item is dropped from parent to child.",
            RuleId::HoMonoDeadline => "The deadline never moves later from parent to child.",
            RuleId::HoMonoMaxHops => "max_hops never rises from parent to child.",
            RuleId::HoMonoSpent => "Spent counters never fall from parent to child.",
            RuleId::ChProposalLink => "A challenge's proposal_task_id names an envelope in the record set that precedes the challenge.",
            RuleId::ChRoundCounted => "A challenge's round equals the counted exchanges (not stopped) from its target's sender to the challenger before it, at least 1.",
            RuleId::DrToPrincipal => "A decision-request goes to a principal.",
            RuleId::DrProposerIsSender => "A decision-request comes from the agent it names as proposer_agent.",
            RuleId::DrChallengeTargetsProposal => "Every attached challenge that is not a HARD gate targets an envelope sent by the proposer.",
            RuleId::DrChallengeResolves => "Every challenge_task_ids entry names a challenge envelope in the record set.",
            RuleId::DrChallengePrecedes => "No attached challenge is sent after the request or descends from it.",
            RuleId::DrChallengeComplete => "Every challenge on the proposer's envelopes and every HARD gate that precedes the request (and, in force, its records) is attached.",
            RuleId::DrRiskCarried => "A request's tier and flags are at least those of every envelope not causally after it (and, in force, after its records).",
            RuleId::DrOneRequest => "One request in force: every other supersedes an earlier request of the same proposer, none twice, with no cycle.",
            RuleId::DrOwnerFromRoot => "A correlation with a request opens with a principal root naming another principal as decision_owner, and requests go to that owner.",
            RuleId::DrClassFromRoot => "A request's decision_class is the one the root declared.",
            RuleId::DrChallengeRequired => "At R2 or above, with any materiality flag, or for automation-investment, a challenge is attached.",
            RuleId::DrDesignatedChallenger => "When a challenge is required, the class's designated challenger attached a completed (or round-capped) challenge of the proposer's envelopes.",
            RuleId::DrProposerNotChallenger => "No attached challenge was sent by the proposer.",
            RuleId::DrAlternatives => "When a challenge is required, at least one alternative is recorded.",
            RuleId::DrUnresolvedDissent => "Every attached open challenge has a dissent entry.",
            RuleId::DrNoApproveOverDissent => "With any attached challenge open, the recommendation is not approve.",
            RuleId::DrHardGate => "With an attached HARD gate open, the recommendation is reject, redesign or escalate.",
            RuleId::DrValueCaseRequired => "An automation-investment request carries a value_case.",
            RuleId::DrcPrincipalSource => "A decision-record comes from a principal.",
            RuleId::DrcDeciderIsSender => "decided_by is the record's own sender.",
            RuleId::DrcRequestBinding => "request_task_id names a decision-request and request_digest is its canonical digest.",
            RuleId::DrcNotRequester => "Neither decider nor second approver is the principal who opened the correlation.",
            RuleId::DrcDeciderIsAddressee => "A decider's record is decided by the principal the request was addressed to.",
            RuleId::DrcAfterRequest => "A record is not sent before its request, and the request does not descend from it.",
            RuleId::DrcOneRecord => "A request has at most one decider's record, and that record at most one co-signing record.",
            RuleId::DrcCompleted => "A decision-record has status completed.",
            RuleId::DrcSecondApprover => "A decider's record at R5, or on an R5 request, names a second approver other than the decider.",
            RuleId::DrcCoSigned => "The in-force decider's record that names a second approver is co-signed by that principal's own record.",
            RuleId::DrcCoSignBinding => "A co-signing record matches its decider's record (request, digest, outcome), comes from its second approver, descends from it, and names no second approver.",
            RuleId::DrcHardGateAcceptance => "Approving over an open attached HARD gate needs risk_acceptance_ref.",
            RuleId::DrcApprovalState => "approval_state is approved for approve or conditional-approve and rejected for reject or redesign.",
            RuleId::StopDepth => "A delegate at hop_count >= max_hops declares delegation-depth-exceeded and is stopped or escalated.",
            RuleId::StopDeadline => "An envelope sent after its deadline declares deadline-passed and is stopped or escalated.",
            RuleId::StopBudget => "An exhausted budget (delegate: spent >= limit; others: spent > limit) declares budget-exhausted and is stopped or escalated.",
            RuleId::StopMissingEvidence => "A delegate or decision-request with blocking missing evidence declares missing-evidence and is stopped or escalated.",
            RuleId::StopLiveGuard => "A delegate whose objective opens with a mutation verb declares live-guard-intent and is stopped or escalated.",
            RuleId::StopInstructionBait => "An objective with override or claimed-approval bait declares conflicting-instructions and is stopped or escalated.",
            RuleId::StopRoutingLoop => "An agent's delegate to an agent already delegated to in its chain declares routing-loop, unless it is the one allowed revisit.",
            RuleId::StopTerminal => "Every child of a stopped envelope is an escalate, and no decision-record binds a request that declares a stop.",
            RuleId::StopChallengeRounds => "A challenge past round 2 declares challenge-rounds-exceeded and is stopped or escalated.",
        }
    }

    /// The reference document (under shared/spec/board/) whose table lists the rule.
    pub fn reference(self) -> &'static str {
        match self {
            RuleId::HoSchema => "handoff-envelope.md",
            RuleId::HoRootParent => "handoff-envelope.md",
            RuleId::HoNoSelfAddress => "handoff-envelope.md",
            RuleId::HoNoExecution => "handoff-envelope.md",
            RuleId::HoAgentNoApproval => "handoff-envelope.md",
            RuleId::HoApprovalOnlyOnRecord => "handoff-envelope.md",
            RuleId::HoEscalateToPrincipal => "handoff-envelope.md",
            RuleId::HoPayloadReturn => "handoff-envelope.md",
            RuleId::HoPayloadChallenge => "handoff-envelope.md",
            RuleId::HoPayloadEscalate => "handoff-envelope.md",
            RuleId::HoPayloadDecisionRequest => "handoff-envelope.md",
            RuleId::HoPayloadDecisionRecord => "handoff-envelope.md",
            RuleId::HoPayloadExclusive => "handoff-envelope.md",
            RuleId::HoStoppedHasReason => "handoff-envelope.md",
            RuleId::HoReasonHasStatus => "handoff-envelope.md",
            RuleId::HoStopNote => "handoff-envelope.md",
            RuleId::HoBlockAsChallenge => "handoff-envelope.md",
            RuleId::HoReturnEvidence => "handoff-envelope.md",
            RuleId::HoDestinationTier => "handoff-envelope.md",
            RuleId::HoUniqueTaskId => "handoff-envelope.md",
            RuleId::HoOneCorrelation => "handoff-envelope.md",
            RuleId::HoOneRoot => "handoff-envelope.md",
            RuleId::HoChainParent => "handoff-envelope.md",
            RuleId::HoChainTime => "handoff-envelope.md",
            RuleId::HoChainCustody => "handoff-envelope.md",
            RuleId::HoReturnToSender => "handoff-envelope.md",
            RuleId::HoAttenActions => "handoff-envelope.md",
            RuleId::HoAttenBudget => "handoff-envelope.md",
            RuleId::HoMonoTier => "handoff-envelope.md",
            RuleId::HoMonoClass => "handoff-envelope.md",
            RuleId::HoMonoMateriality => "handoff-envelope.md",
            RuleId::HoMonoProhibitions => "handoff-envelope.md",
            RuleId::HoMonoDeadline => "handoff-envelope.md",
            RuleId::HoMonoMaxHops => "handoff-envelope.md",
            RuleId::HoMonoSpent => "handoff-envelope.md",
            RuleId::ChProposalLink => "decision-record.md",
            RuleId::ChRoundCounted => "decision-record.md",
            RuleId::DrToPrincipal => "decision-record.md",
            RuleId::DrProposerIsSender => "decision-record.md",
            RuleId::DrChallengeTargetsProposal => "decision-record.md",
            RuleId::DrChallengeResolves => "decision-record.md",
            RuleId::DrChallengePrecedes => "decision-record.md",
            RuleId::DrChallengeComplete => "decision-record.md",
            RuleId::DrRiskCarried => "decision-record.md",
            RuleId::DrOneRequest => "decision-record.md",
            RuleId::DrOwnerFromRoot => "decision-record.md",
            RuleId::DrClassFromRoot => "decision-record.md",
            RuleId::DrChallengeRequired => "decision-record.md",
            RuleId::DrDesignatedChallenger => "decision-record.md",
            RuleId::DrProposerNotChallenger => "decision-record.md",
            RuleId::DrAlternatives => "decision-record.md",
            RuleId::DrUnresolvedDissent => "decision-record.md",
            RuleId::DrNoApproveOverDissent => "decision-record.md",
            RuleId::DrHardGate => "decision-record.md",
            RuleId::DrValueCaseRequired => "decision-record.md",
            RuleId::DrcPrincipalSource => "decision-record.md",
            RuleId::DrcDeciderIsSender => "decision-record.md",
            RuleId::DrcRequestBinding => "decision-record.md",
            RuleId::DrcNotRequester => "decision-record.md",
            RuleId::DrcDeciderIsAddressee => "decision-record.md",
            RuleId::DrcAfterRequest => "decision-record.md",
            RuleId::DrcOneRecord => "decision-record.md",
            RuleId::DrcCompleted => "decision-record.md",
            RuleId::DrcSecondApprover => "decision-record.md",
            RuleId::DrcCoSigned => "decision-record.md",
            RuleId::DrcCoSignBinding => "decision-record.md",
            RuleId::DrcHardGateAcceptance => "decision-record.md",
            RuleId::DrcApprovalState => "decision-record.md",
            RuleId::StopDepth => "stop-conditions.md",
            RuleId::StopDeadline => "stop-conditions.md",
            RuleId::StopBudget => "stop-conditions.md",
            RuleId::StopMissingEvidence => "stop-conditions.md",
            RuleId::StopLiveGuard => "stop-conditions.md",
            RuleId::StopInstructionBait => "stop-conditions.md",
            RuleId::StopRoutingLoop => "stop-conditions.md",
            RuleId::StopTerminal => "stop-conditions.md",
            RuleId::StopChallengeRounds => "stop-conditions.md",
        }
    }

    /// The rule with this printed id.
    pub fn from_id(id: &str) -> Option<RuleId> {
        RuleId::ALL.iter().copied().find(|r| r.as_str() == id)
    }
}

impl fmt::Display for RuleId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_round_trip() {
        let mut seen = std::collections::HashSet::new();
        for r in RuleId::ALL {
            assert!(seen.insert(r.as_str()));
            assert_eq!(RuleId::from_id(r.as_str()), Some(r));
        }
        assert_eq!(seen.len(), 77);
    }
}
