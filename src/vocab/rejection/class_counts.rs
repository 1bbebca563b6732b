//! A class refusal's numbers ([`ClassCounts`]): packed inline in the [`Rejection`], so that no
//! refusal allocates, and turned into the class part of its detail when asked.

use super::{n32, ClassCapacity, ClassDetail, ClassTokenCapacity, SharedAmount, SharedCapacity};
#[cfg(doc)]
use super::{Counts, Rejection};

/// A class refusal's own numbers and the shared remainder's, packed: every slot count of a
/// bulkhead with classes fits 16 bits and every token count 32 (`crate::words::class_word`;
/// wider values saturate), so the record is five words and a refusal carries it inline. What
/// follows from these and the [`Counts`] (the shared capacities, what the demand would borrow,
/// every `available`) is computed by [`Rejection::detail`] when asked.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ClassCounts {
    /// The class's name, interned when the bulkhead was built (`crate::sync::intern`): one
    /// word, where a `&'static str` is two.
    name: &'static &'static str,
    /// The class's tokens (low 32 bits), slots in use (bits 32..48), concurrency floor (48..64).
    own: u64,
    /// The class's token floor (low 32), concurrency ceiling (32..48), shared slots in use
    /// (48..64).
    floors: u64,
    /// The class's token ceiling.
    max_tokens: u32,
    /// `Σ protected_concurrent`.
    sum_pc: u16,
    /// Which ceilings the class has (and, through its spare values, which [`More`] this is).
    ceilings: Ceilings,
    /// `Σ protected_tokens` (low 32 bits) and the shared tokens in use (high 32).
    shared_tokens: u64,
}

/// Which of its two ceilings a class has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Ceilings {
    Neither,
    Concurrency,
    Tokens,
    Both,
}

impl Ceilings {
    /// From bits: bit 0 a concurrency ceiling, bit 1 a token ceiling (higher bits ignored).
    #[inline(always)]
    pub(crate) fn from_bits(bits: u8) -> Ceilings {
        match bits & 3 {
            0 => Ceilings::Neither,
            1 => Ceilings::Concurrency,
            2 => Ceilings::Tokens,
            _ => Ceilings::Both,
        }
    }
}

/// A class refusal's numbers in [`ClassCounts`]'s layout ([`ClassCounts::from_words`]), for a
/// decision that has them in fields already within their widths.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ClassWords {
    pub(crate) own: u64,
    pub(crate) floors: u64,
    pub(crate) max_tokens: u32,
    pub(crate) sum_pc: u16,
    pub(crate) ceilings: Ceilings,
    pub(crate) shared_tokens: u64,
}

/// A class refusal's numbers, unpacked ([`ClassCounts::new`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ClassNumbers {
    /// The class's slots in use and tokens, its floors and ceilings.
    pub(crate) in_flight: u64,
    pub(crate) tokens: u64,
    pub(crate) protected_concurrent: u64,
    pub(crate) max_concurrent: Option<u64>,
    pub(crate) protected_tokens: u64,
    pub(crate) max_tokens: Option<u64>,
    /// `Σ protected_concurrent`, `Σ protected_tokens`.
    pub(crate) sum_pc: u64,
    pub(crate) sum_pt: u64,
    /// What is borrowed of the shared remainder (slots, tokens).
    pub(crate) shared_slots_in_use: u64,
    pub(crate) shared_tokens_in_use: u64,
}

/// `x` in 16 bits (saturating; the engine's slot counts fit).
#[inline(always)]
fn n16(x: u64) -> u64 {
    x.min(0xffff)
}

impl ClassCounts {
    /// The numbers of class `name`, already packed (the layout of the fields above).
    #[inline(always)]
    pub(crate) fn from_words(name: &'static &'static str, w: ClassWords) -> ClassCounts {
        ClassCounts {
            name,
            own: w.own,
            floors: w.floors,
            max_tokens: w.max_tokens,
            sum_pc: w.sum_pc,
            ceilings: w.ceilings,
            shared_tokens: w.shared_tokens,
        }
    }

    /// The numbers `n` of class `name`, packed.
    #[inline(always)]
    pub(crate) fn new(name: &'static &'static str, n: ClassNumbers) -> ClassCounts {
        let ceilings = match (n.max_concurrent.is_some(), n.max_tokens.is_some()) {
            (false, false) => Ceilings::Neither,
            (true, false) => Ceilings::Concurrency,
            (false, true) => Ceilings::Tokens,
            (true, true) => Ceilings::Both,
        };
        ClassCounts {
            name,
            own: u64::from(n32(n.tokens))
                | (n16(n.in_flight) << 32)
                | (n16(n.protected_concurrent) << 48),
            floors: u64::from(n32(n.protected_tokens))
                | (n16(n.max_concurrent.unwrap_or(0)) << 32)
                | (n16(n.shared_slots_in_use) << 48),
            max_tokens: n32(n.max_tokens.unwrap_or(0)),
            sum_pc: n16(n.sum_pc) as u16,
            ceilings,
            shared_tokens: u64::from(n32(n.sum_pt))
                | (u64::from(n32(n.shared_tokens_in_use)) << 32),
        }
    }

    fn in_flight(&self) -> u64 {
        (self.own >> 32) & 0xffff
    }

    fn tokens(&self) -> u64 {
        self.own & 0xffff_ffff
    }

    fn protected_concurrent(&self) -> u64 {
        self.own >> 48
    }

    pub(super) fn protected_tokens(&self) -> u64 {
        self.floors & 0xffff_ffff
    }

    fn max_concurrent(&self) -> Option<u64> {
        matches!(self.ceilings, Ceilings::Concurrency | Ceilings::Both)
            .then_some((self.floors >> 32) & 0xffff)
    }

    pub(super) fn max_tokens(&self) -> Option<u64> {
        matches!(self.ceilings, Ceilings::Tokens | Ceilings::Both)
            .then_some(u64::from(self.max_tokens))
    }

    fn shared_slots_in_use(&self) -> u64 {
        self.floors >> 48
    }

    fn sum_pt(&self) -> u64 {
        self.shared_tokens & 0xffff_ffff
    }

    fn shared_tokens_in_use(&self) -> u64 {
        self.shared_tokens >> 32
    }

    /// The shared remainder's tokens under effective budget `eff`.
    pub(super) fn shared_token_capacity(&self, eff: u64) -> u64 {
        eff.saturating_sub(self.sum_pt())
    }

    /// What a demand of `r` tokens would borrow: `(slot?, tokens)` (`Summary::borrow`).
    fn borrows(&self, r: u64) -> (bool, u64) {
        let (i, t) = (self.in_flight(), self.tokens());
        let tokens = if r == 0 {
            0
        } else {
            r - r.min(self.protected_tokens().saturating_sub(t))
        };
        (i >= self.protected_concurrent(), tokens)
    }
}

impl ClassCounts {
    /// The class detail under `max_concurrent` and (with a budget) the demand's effective
    /// budget `eff`, for a demand of `r` tokens.
    pub(super) fn detail(&self, max_concurrent: u64, eff: Option<u64>, r: u64) -> ClassDetail {
        let amount = |capacity: u64, in_use: u64, requested_borrowed: u64| SharedAmount {
            capacity,
            in_use,
            available: capacity.saturating_sub(in_use),
            requested_borrowed,
        };
        let (i, pc) = (self.in_flight(), self.protected_concurrent());
        let (t, pt) = (self.tokens(), self.protected_tokens());
        let (mc, mt) = (self.max_concurrent(), self.max_tokens());
        let (borrows_slot, borrows_tokens) = self.borrows(r);
        ClassDetail {
            shared: SharedCapacity {
                concurrency: amount(
                    max_concurrent.saturating_sub(self.sum_pc.into()),
                    self.shared_slots_in_use(),
                    u64::from(borrows_slot),
                ),
                token_budget: eff.map(|eff| {
                    amount(
                        self.shared_token_capacity(eff),
                        self.shared_tokens_in_use(),
                        borrows_tokens,
                    )
                }),
            },
            class: ClassCapacity {
                id: (*self.name).to_owned(),
                in_flight: i,
                protected_concurrent: pc,
                protected_concurrent_in_use: i.min(pc),
                borrowed_concurrent: i - i.min(pc),
                available_protected_concurrent: pc.saturating_sub(i),
                max_concurrent: mc,
                available_concurrent: mc.map(|m| m.saturating_sub(i)),
                token_budget: eff.map(|_| ClassTokenCapacity {
                    in_flight_tokens: t,
                    protected_tokens: pt,
                    protected_tokens_in_use: t.min(pt),
                    borrowed_tokens: t - t.min(pt),
                    available_protected_tokens: pt.saturating_sub(t),
                    max_tokens: mt,
                    available: mt.map(|m| m.saturating_sub(t)),
                    requested: r,
                }),
            },
        }
    }
}
