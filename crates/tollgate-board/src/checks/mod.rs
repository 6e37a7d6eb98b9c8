//! One named check per rule id. Each check reads the shared index ([`Ctx`]) and appends every
//! violation it finds; none stops at the first. HO-SCHEMA is [`crate::ho_schema`], which
//! runs before the index exists.

use crate::index::Ctx;
use crate::{Finding, RuleId};

pub mod chain;
pub mod decision;
pub mod envelope;
pub mod record;
pub mod stop;

/// A rule's check.
pub type Check = fn(&Ctx<'_>, &mut Vec<Finding>);

/// Every rule after HO-SCHEMA, with its check.
pub const CHECKS: [(RuleId, Check); 76] = [
    (RuleId::HoRootParent, envelope::ho_root_parent),
    (RuleId::HoNoSelfAddress, envelope::ho_no_self_address),
    (RuleId::HoNoExecution, envelope::ho_no_execution),
    (RuleId::HoAgentNoApproval, envelope::ho_agent_no_approval),
    (
        RuleId::HoApprovalOnlyOnRecord,
        envelope::ho_approval_only_on_record,
    ),
    (
        RuleId::HoEscalateToPrincipal,
        envelope::ho_escalate_to_principal,
    ),
    (RuleId::HoPayloadReturn, envelope::ho_payload_return),
    (RuleId::HoPayloadChallenge, envelope::ho_payload_challenge),
    (RuleId::HoPayloadEscalate, envelope::ho_payload_escalate),
    (
        RuleId::HoPayloadDecisionRequest,
        envelope::ho_payload_decision_request,
    ),
    (
        RuleId::HoPayloadDecisionRecord,
        envelope::ho_payload_decision_record,
    ),
    (RuleId::HoPayloadExclusive, envelope::ho_payload_exclusive),
    (RuleId::HoStoppedHasReason, envelope::ho_stopped_has_reason),
    (RuleId::HoReasonHasStatus, envelope::ho_reason_has_status),
    (RuleId::HoStopNote, envelope::ho_stop_note),
    (RuleId::HoBlockAsChallenge, envelope::ho_block_as_challenge),
    (RuleId::HoReturnEvidence, envelope::ho_return_evidence),
    (RuleId::HoDestinationTier, envelope::ho_destination_tier),
    (RuleId::HoUniqueTaskId, envelope::ho_unique_task_id),
    (RuleId::HoOneCorrelation, envelope::ho_one_correlation),
    (RuleId::HoOneRoot, envelope::ho_one_root),
    (RuleId::HoChainParent, chain::ho_chain_parent),
    (RuleId::HoChainTime, chain::ho_chain_time),
    (RuleId::HoChainCustody, chain::ho_chain_custody),
    (RuleId::HoReturnToSender, chain::ho_return_to_sender),
    (RuleId::HoAttenActions, chain::ho_atten_actions),
    (RuleId::HoAttenBudget, chain::ho_atten_budget),
    (RuleId::HoMonoTier, chain::ho_mono_tier),
    (RuleId::HoMonoClass, chain::ho_mono_class),
    (RuleId::HoMonoMateriality, chain::ho_mono_materiality),
    (RuleId::HoMonoProhibitions, chain::ho_mono_prohibitions),
    (RuleId::HoMonoDeadline, chain::ho_mono_deadline),
    (RuleId::HoMonoMaxHops, chain::ho_mono_max_hops),
    (RuleId::HoMonoSpent, chain::ho_mono_spent),
    (RuleId::ChProposalLink, decision::ch_proposal_link),
    (RuleId::ChRoundCounted, decision::ch_round_counted),
    (RuleId::DrToPrincipal, decision::dr_to_principal),
    (RuleId::DrProposerIsSender, decision::dr_proposer_is_sender),
    (
        RuleId::DrChallengeTargetsProposal,
        decision::dr_challenge_targets_proposal,
    ),
    (RuleId::DrChallengeResolves, decision::dr_challenge_resolves),
    (RuleId::DrChallengePrecedes, decision::dr_challenge_precedes),
    (RuleId::DrChallengeComplete, decision::dr_challenge_complete),
    (RuleId::DrRiskCarried, decision::dr_risk_carried),
    (RuleId::DrOneRequest, decision::dr_one_request),
    (RuleId::DrOwnerFromRoot, decision::dr_owner_from_root),
    (RuleId::DrClassFromRoot, decision::dr_class_from_root),
    (RuleId::DrChallengeRequired, decision::dr_challenge_required),
    (
        RuleId::DrDesignatedChallenger,
        decision::dr_designated_challenger,
    ),
    (
        RuleId::DrProposerNotChallenger,
        decision::dr_proposer_not_challenger,
    ),
    (RuleId::DrAlternatives, decision::dr_alternatives),
    (RuleId::DrUnresolvedDissent, decision::dr_unresolved_dissent),
    (
        RuleId::DrNoApproveOverDissent,
        decision::dr_no_approve_over_dissent,
    ),
    (RuleId::DrHardGate, decision::dr_hard_gate),
    (
        RuleId::DrValueCaseRequired,
        decision::dr_value_case_required,
    ),
    (RuleId::DrcPrincipalSource, record::drc_principal_source),
    (RuleId::DrcDeciderIsSender, record::drc_decider_is_sender),
    (RuleId::DrcRequestBinding, record::drc_request_binding),
    (RuleId::DrcNotRequester, record::drc_not_requester),
    (
        RuleId::DrcDeciderIsAddressee,
        record::drc_decider_is_addressee,
    ),
    (RuleId::DrcAfterRequest, record::drc_after_request),
    (RuleId::DrcOneRecord, record::drc_one_record),
    (RuleId::DrcCompleted, record::drc_completed),
    (RuleId::DrcSecondApprover, record::drc_second_approver),
    (RuleId::DrcCoSigned, record::drc_co_signed),
    (RuleId::DrcCoSignBinding, record::drc_co_sign_binding),
    (
        RuleId::DrcHardGateAcceptance,
        record::drc_hard_gate_acceptance,
    ),
    (RuleId::DrcApprovalState, record::drc_approval_state),
    (RuleId::StopDepth, stop::stop_depth),
    (RuleId::StopDeadline, stop::stop_deadline),
    (RuleId::StopBudget, stop::stop_budget),
    (RuleId::StopMissingEvidence, stop::stop_missing_evidence),
    (RuleId::StopLiveGuard, stop::stop_live_guard),
    (RuleId::StopInstructionBait, stop::stop_instruction_bait),
    (RuleId::StopRoutingLoop, stop::stop_routing_loop),
    (RuleId::StopTerminal, stop::stop_terminal),
    (RuleId::StopChallengeRounds, stop::stop_challenge_rounds),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rule_but_schema_has_exactly_one_check() {
        for r in RuleId::ALL {
            let n = CHECKS.iter().filter(|(id, _)| *id == r).count();
            let want = usize::from(r != RuleId::HoSchema);
            assert_eq!(n, want, "{r}");
        }
    }
}
