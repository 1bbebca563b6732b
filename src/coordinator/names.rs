//! Provider names → indices, fixed when the coordinator is built and looked up on every
//! submit and cooldown.

/// Provider names → indices. A few names are compared one by one (a length compare rejects
/// most at once), cheaper than hashing the name; many go through a hash map.
pub(crate) enum Names {
    Few(Box<[Box<str>]>),
    Many(foldhash::HashMap<String, usize>),
}

impl Names {
    /// Up to this many providers are scanned.
    const SCAN: usize = 8;

    pub(crate) fn new(map: foldhash::HashMap<String, usize>) -> Self {
        if map.len() > Self::SCAN {
            return Names::Many(map);
        }
        let mut v: Vec<(String, usize)> = map.into_iter().collect();
        v.sort_by_key(|(_, i)| *i);
        Names::Few(v.into_iter().map(|(n, _)| n.into_boxed_str()).collect())
    }

    #[inline]
    pub(crate) fn get(&self, name: &str) -> Option<usize> {
        match self {
            Names::Few(v) => v.iter().position(|n| **n == *name),
            Names::Many(m) => m.get(name).copied(),
        }
    }
}
