// Per-request draft length from the request's own acceptance (issue 52: adaptive K, opt-in with
// --speculative-adaptive-k). Draft position j (1-based) is verified only when the j - 1 drafts
// before it were accepted, so with a per-draft acceptance rate a it is accepted with probability
// a^j; a verify row costs about as much whether its draft is accepted or not. The request drafts
// the positions worth their row: j <= K while a^j >= kMinAcceptance, and always at least one, so
// a request whose drafts are rejected keeps probing with one draft per step and recovers its full
// length once drafts are accepted again.
#pragma once

namespace llm {

class AdaptiveDraftLength {
 public:
  // A draft position is proposed while its acceptance probability is at least this.
  static constexpr double kMinAcceptance = 0.3;
  // The weight of a verification's evidence against the running estimate (an exponential moving
  // average over about 1 / kDecay verifications).
  static constexpr double kDecay = 0.2;

  explicit AdaptiveDraftLength(int max_drafts) : max_drafts_(max_drafts) {}

  // The number of drafts to propose next, in [1, max_drafts].
  int Next() const;
  // One verification: `drafted` drafts (>= 1), of which the first `accepted` were accepted.
  void Observe(int drafted, int accepted);
  // The estimated per-draft acceptance rate.
  double acceptance() const { return accepted_ / trials_; }

 private:
  int max_drafts_;
  // Decayed counts of accepted drafts and of drafts whose fate was observed (the accepted ones
  // and the first rejected one); the start is an optimistic prior of 0.8 with weight 1, so a
  // request starts at the full length.
  double accepted_ = 0.8, trials_ = 1.0;
};

}  // namespace llm
