"""Issue 15, twenty-eighth hostile review, follow-up: regression tests of its findings.

4. ``data.synthetic.user_size_knobs([1])`` raised ``TypeError: unhashable type: 'list'``
   rather than a ``ValueError`` naming the parameter.
"""

from __future__ import annotations

import pytest

from fedprivopt.data.synthetic import user_size_knobs

# -- finding 4: user_size_knobs of a non-string ----------------------------------------------------


@pytest.mark.parametrize("value", [[1], {"small": 1}, None, 1])
def test_4_user_size_knobs_of_a_non_string_is_a_value_error_naming_it(value):
    with pytest.raises(ValueError, match="synth_user_sizes must be one of small, real"):
        user_size_knobs(value, "synth_user_sizes")
    with pytest.raises(ValueError, match="user_sizes must be one of"):
        user_size_knobs(value)
