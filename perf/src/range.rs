//! `MIN[-MAX]` millisecond ranges (--delay, --ttl) and the small PRNG that draws from them.

use std::fmt;
use std::str::FromStr;

/// An inclusive range of milliseconds, drawn from uniformly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MsRange {
    pub min: u64,
    pub max: u64,
}

impl FromStr for MsRange {
    type Err = String;

    /// `N` or `MIN-MAX`, in milliseconds.
    fn from_str(s: &str) -> Result<Self, String> {
        let num = |t: &str| {
            t.trim()
                .parse::<u64>()
                .map_err(|_| format!("{t:?} is not a whole number of milliseconds"))
        };
        let (min, max) = match s.split_once('-') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => (num(s)?, num(s)?),
        };
        if min > max {
            return Err(format!("{s:?}: MIN is above MAX"));
        }
        Ok(MsRange { min, max })
    }
}

impl fmt::Display for MsRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.min == self.max {
            write!(f, "{} ms", self.min)
        } else {
            write!(f, "{}-{} ms", self.min, self.max)
        }
    }
}

impl MsRange {
    /// A uniformly random value in the range.
    pub fn sample(&self, rng: &mut Rng) -> u64 {
        match (self.max - self.min).checked_add(1) {
            Some(span) => self.min + rng.next_u64() % span,
            None => rng.next_u64(), // the whole u64 range
        }
    }
}

/// SplitMix64: tiny, fast and plenty for spreading delays (not for anything secret).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_single_values_and_ranges() {
        assert_eq!("500".parse(), Ok(MsRange { min: 500, max: 500 }));
        assert_eq!(
            "30000-90000".parse(),
            Ok(MsRange {
                min: 30000,
                max: 90000
            })
        );
        assert!("9-1".parse::<MsRange>().is_err());
        assert!("-5".parse::<MsRange>().is_err());
        assert!("1s".parse::<MsRange>().is_err());
    }

    #[test]
    fn samples_stay_in_range_and_cover_it() {
        let r = MsRange { min: 10, max: 13 };
        let mut rng = Rng::new(7);
        let mut seen = [false; 4];
        for _ in 0..1000 {
            let v = r.sample(&mut rng);
            assert!((10..=13).contains(&v));
            seen[(v - 10) as usize] = true;
        }
        assert!(seen.iter().all(|s| *s));
        assert_eq!(MsRange { min: 5, max: 5 }.sample(&mut rng), 5);
    }
}
