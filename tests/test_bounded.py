from collections import OrderedDict

from swarmnode.bounded import note_newest


def test_the_oldest_note_makes_way_and_a_renewed_one_is_newest_again():
    notes: OrderedDict[str, int] = OrderedDict()
    for i, key in enumerate("abc"):
        note_newest(notes, key, i, most=3)
    note_newest(notes, "a", 9, most=3)  # renewed: newest now, with its new value
    note_newest(notes, "d", 3, most=3)
    assert list(notes.items()) == [("c", 2), ("a", 9), ("d", 3)], "b, the oldest, made way"
