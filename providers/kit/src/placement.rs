//! Where a VM without a failure domain goes, by the same rule on every hypervisor: to the
//! candidate (node, host) with the most free memory, so VMs spread by free capacity instead of
//! filling the first one. Ties go to the first name, so the choice is deterministic. A candidate
//! whose free memory is unknown (it did not answer) is passed over; when none is known, the
//! first by name is taken and its step then says why it cannot be used.

/// The name of the candidate with the most free memory (see the module docs); `None` when there
/// is no candidate.
pub fn roomiest<'a>(candidates: impl IntoIterator<Item = (&'a str, Option<u64>)>) -> Option<&'a str> {
    let mut known: Option<(u64, &str)> = None;
    let mut first: Option<&str> = None;
    for (name, free) in candidates {
        first = Some(first.map_or(name, |f| f.min(name)));
        if let Some(free) = free
            && known.is_none_or(|(most, at)| free > most || (free == most && name < at))
        {
            known = Some((free, name));
        }
    }
    known.map(|(_, name)| name).or(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_most_free_memory_wins_and_ties_go_to_the_first_name() {
        assert_eq!(
            roomiest([("b", Some(4)), ("a", Some(8)), ("c", Some(2))]),
            Some("a")
        );
        assert_eq!(
            roomiest([("c", Some(8)), ("b", Some(8)), ("a", Some(1))]),
            Some("b")
        );
    }

    #[test]
    fn unknown_free_memory_is_passed_over_unless_nothing_is_known() {
        assert_eq!(roomiest([("a", None), ("b", Some(1))]), Some("b"));
        assert_eq!(roomiest([("b", None), ("a", None)]), Some("a"));
        assert_eq!(roomiest(std::iter::empty()), None);
    }
}
