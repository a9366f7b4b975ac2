"""MeshTrait: slice, split, rename, flatten and sizes, through its two abstract members."""

from __future__ import annotations

import pytest

from danaus._mesh import Extent, MeshTrait, Shape, Slice


class RankMesh(MeshTrait):
    """The smallest mesh: just a Shape. Shows MeshTrait needs only its two members."""

    def __init__(self, shape: Shape) -> None:
        self.shape = shape

    @property
    def _shape(self) -> Shape:
        return self.shape

    def _new_with_shape(self, shape: Shape) -> RankMesh:
        return RankMesh(shape)


class Index:
    """An int-like object (as numpy integers are): has ``__index__`` only."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


def mesh(labels: list[str], sizes: list[int]) -> RankMesh:
    return RankMesh(Shape(labels, Slice.new_row_major(sizes)))


@pytest.fixture
def m() -> RankMesh:
    """A 2x3x4 mesh over ranks 0..23 with dims a, b, c."""
    return mesh(["a", "b", "c"], [2, 3, 4])


# -- the contract ------------------------------------------------------------


def test_mesh_trait_is_abstract_in_shape_and_new_with_shape() -> None:
    assert MeshTrait.__abstractmethods__ == frozenset({"_shape", "_new_with_shape"})

    class Partial(MeshTrait):
        @property
        def _shape(self) -> Shape:
            return Shape.unity()

    with pytest.raises(TypeError, match="_new_with_shape"):
        Partial()  # type: ignore[abstract]


def test_mesh_trait_defines_no_init_and_only_the_documented_public_names() -> None:
    assert "__init__" not in vars(MeshTrait)
    public = {name for name in dir(MeshTrait) if not name.startswith("_")}
    assert public == {
        "slice",
        "split",
        "rename",
        "flatten",
        "size",
        "sizes",
        "extent",
        "region",
        "to_table",
    }


# -- slice ---------------------------------------------------------------------


def test_slice_with_an_int_removes_the_dim_and_with_a_slice_keeps_it(m: RankMesh) -> None:
    cut = m.slice(a=1, c=slice(0, 4, 2))
    assert isinstance(cut, RankMesh)
    assert cut.shape.labels == ["b", "c"]
    assert cut.shape.ndslice == Slice(offset=12, sizes=[3, 2], strides=[4, 2])
    assert cut.shape.ranks() == [12, 14, 16, 18, 20, 22]


def test_slice_with_no_arguments_keeps_the_whole_mesh(m: RankMesh) -> None:
    assert m.slice().shape == m.shape


def test_slice_accepts_int_like_objects(m: RankMesh) -> None:
    assert m.slice(b=Index(2)).shape == m.slice(b=2).shape


def test_slices_of_slices_compose_on_global_ranks(m: RankMesh) -> None:
    twice = m.slice(c=slice(1, 4)).slice(c=slice(1, 3))
    assert twice.shape == m.slice(c=slice(2, 4)).shape
    stepped = m.slice(c=slice(None, None, 2)).slice(c=1, b=slice(1, None))
    assert stepped.shape.ranks() == [6, 10, 18, 22]


def test_slice_of_unknown_dim_raises_type_error_listing_the_dims(m: RankMesh) -> None:
    with pytest.raises(TypeError, match=r"'cc'.*\['a', 'b', 'c'\].*Probably you meant 'c'"):
        m.slice(cc=0)


@pytest.mark.parametrize("index", [3, -1])
def test_slice_int_out_of_range_or_negative_raises_index_error_with_the_size(
    m: RankMesh, index: int
) -> None:
    with pytest.raises(IndexError, match=f"index {index} out of range.*size 3"):
        m.slice(b=index)


@pytest.mark.parametrize("selector", ["0", 1.0, True, None, [0, 1], (0, 1)])
def test_slice_with_anything_but_int_or_slice_raises_type_error(
    m: RankMesh, selector: object
) -> None:
    with pytest.raises(TypeError, match=r"expected an int .* or a slice"):
        m.slice(b=selector)  # type: ignore[arg-type]


def test_slice_with_a_zero_step_raises_value_error(m: RankMesh) -> None:
    with pytest.raises(ValueError, match="step must be positive"):
        m.slice(b=slice(0, 3, 0))


@pytest.mark.parametrize("selector", [slice(5, 9), slice(3, None), slice(2, 2), slice(2, 1)])
def test_a_slice_that_selects_nothing_raises_value_error_as_monarch_does(
    m: RankMesh, selector: slice
) -> None:
    with pytest.raises(ValueError, match=r"selects no rank of dimension 'b' \(size 3"):
        m.slice(b=selector)


def test_a_slice_reaching_past_the_end_is_clamped(m: RankMesh) -> None:
    assert m.slice(b=slice(1, 9)).shape == m.slice(b=slice(1, 3)).shape


# -- split ---------------------------------------------------------------------


def test_split_factors_a_dim_row_major_with_the_other_size_inferred() -> None:
    m = mesh(["host", "gpu"], [2, 8])
    s = m.split(gpu=("tp", "cp"), cp=2)
    assert s.shape.labels == ["host", "tp", "cp"]
    assert s.shape.ndslice == Slice(offset=0, sizes=[2, 4, 2], strides=[8, 2, 1])
    assert s.shape.ranks() == m.shape.ranks()


def test_split_infers_whichever_size_is_left_out() -> None:
    m = mesh(["host", "gpu"], [2, 8])
    s = m.split(gpu=("tp", "cp"), tp=2)
    assert s.shape.ndslice.sizes == [2, 2, 4]
    assert s.shape.ndslice.strides == [8, 4, 1]


def test_split_of_several_dims_at_once() -> None:
    m = mesh(["host", "gpu"], [4, 8])
    s = m.split(host=("dp", "pp"), gpu=("tp", "cp"), pp=2, cp=4)
    assert s.shape.labels == ["dp", "pp", "tp", "cp"]
    assert s.shape.ndslice == Slice(offset=0, sizes=[2, 2, 2, 4], strides=[16, 8, 4, 1])


def test_split_with_every_size_given_and_into_size_one_dims() -> None:
    m = mesh(["gpu"], [6])
    assert m.split(gpu=("x", "y"), x=2, y=3).shape.ndslice.sizes == [2, 3]
    assert m.split(gpu=("one", "all"), one=1).shape.ndslice == Slice(0, [1, 6], [6, 1])
    assert m.split(gpu=("g",)).shape.labels == ["g"]


def test_split_of_a_strided_mesh_keeps_its_global_layout(m: RankMesh) -> None:
    cut = m.slice(a=1, c=slice(0, 4, 2))  # offset 12, sizes (3, 2), strides (4, 2)
    s = cut.split(b=("x", "y"), x=1)
    assert s.shape.ndslice == Slice(offset=12, sizes=[1, 3, 2], strides=[12, 4, 2])
    assert s.shape.ranks() == cut.shape.ranks()


def test_split_into_a_non_divisor_raises_value_error_with_the_sizes() -> None:
    m = mesh(["host", "gpu"], [2, 8])
    with pytest.raises(ValueError, match=r"'gpu' of size 8.*\{'tp': '\?', 'cp': 3\}"):
        m.split(gpu=("tp", "cp"), cp=3)
    with pytest.raises(ValueError, match=r"'gpu' of size 8.*\{'x': 2, 'y': 2\}"):
        m.split(gpu=("x", "y"), x=2, y=2)


def test_split_with_two_unknown_sizes_in_a_group_raises_value_error() -> None:
    with pytest.raises(ValueError, match=r"cannot infer the sizes of \['x', 'y'\]"):
        mesh(["gpu"], [8]).split(gpu=("x", "y", "z"), z=2)


def test_split_size_for_a_name_that_is_not_new_is_an_unused_constraint() -> None:
    m = mesh(["host", "gpu"], [2, 8])
    with pytest.raises(ValueError, match=r"size for 'cpp'.*Probably you meant 'cp'"):
        m.split(gpu=("tp", "cp"), cp=2, cpp=4)
    with pytest.raises(ValueError, match="size for 'tp'"):
        m.split(tp=4)


def test_split_errors_begin_with_monarchs_words() -> None:
    # what Monarch's test_device_mesh and test_mesh_trait match (its MeshTrait's messages)
    m = mesh(["host", "gpu"], [60, 24])
    with pytest.raises(ValueError, match=r"^Cannot infer size"):
        m.split(host=("dp", "pp"))
    with pytest.raises(ValueError, match=r"^unused size constraints"):
        m.split(host=("dp", "pp"), pp=4, ddp=3)
    with pytest.raises(ValueError, match=r"^Duplicate dimension name"):
        m.split(host=("dp", "pp"), gpu=("pp",), dp=3)
    with pytest.raises(ValueError, match="is not evenly divided"):
        m.split(host=("dp", "pp"), dp=7)


def test_split_that_would_repeat_a_name_raises_value_error() -> None:
    m = mesh(["host", "gpu"], [2, 8])
    with pytest.raises(ValueError, match="Duplicate dimension name 'host'"):
        m.split(gpu=("host", "x"), x=2)
    with pytest.raises(ValueError, match="Duplicate dimension name 'x'"):
        m.split(gpu=("x", "x"))


def test_split_of_an_unknown_dim_raises_type_error() -> None:
    with pytest.raises(TypeError, match=r"cannot split.*'gpus'.*Probably you meant 'gpu'"):
        mesh(["host", "gpu"], [2, 8]).split(gpus=("a", "b"), a=2)


def test_split_checks_the_type_of_each_argument() -> None:
    m = mesh(["host", "gpu"], [2, 8])
    with pytest.raises(TypeError, match=r"Probably you meant gpu=\('tp',\)"):
        m.split(gpu="tp")
    with pytest.raises(TypeError, match="existing dimension"):
        m.split(gpu=2)
    with pytest.raises(TypeError, match="'4'"):
        m.split(gpu=("tp", "cp"), cp="4")
    with pytest.raises(ValueError, match="must be >= 1, got 0"):
        m.split(gpu=("tp", "cp"), cp=0)
    with pytest.raises(TypeError, match="must be a str"):
        m.split(gpu=("tp", 2))


# -- rename --------------------------------------------------------------------


def test_rename_changes_names_and_keeps_ranks(m: RankMesh) -> None:
    r = m.rename(a="hosts", c="gpus")
    assert r.shape.labels == ["hosts", "b", "gpus"]
    assert r.shape.ndslice == m.shape.ndslice


def test_rename_can_swap_two_names(m: RankMesh) -> None:
    assert m.rename(a="b", b="a").shape.labels == ["b", "a", "c"]


def test_rename_errors_name_the_bad_argument(m: RankMesh) -> None:
    with pytest.raises(TypeError, match=r"'z'.*\['a', 'b', 'c'\]"):
        m.rename(z="y")
    with pytest.raises(ValueError, match="Duplicate dimension name 'b'"):
        m.rename(a="b")
    with pytest.raises(TypeError, match=r"Probably you meant split\(\)"):
        m.rename(a=("x", "y"))  # type: ignore[arg-type]


# -- flatten -------------------------------------------------------------------


def test_flatten_of_a_dense_mesh_keeps_the_rank_order(m: RankMesh) -> None:
    f = m.flatten("r")
    assert f.shape == Shape(["r"], Slice(0, [24], [1]))
    inner = m.slice(a=1).flatten("r")
    assert inner.shape == Shape(["r"], Slice(12, [12], [1]))


def test_flatten_ignores_the_stride_of_size_one_dims(m: RankMesh) -> None:
    f = m.slice(b=slice(1, 2)).slice(a=0).flatten("r")  # sizes (1, 4), strides (4, 1)
    assert f.shape.ranks() == [4, 5, 6, 7]


def test_flatten_of_a_sparse_mesh_raises_value_error(m: RankMesh) -> None:
    with pytest.raises(ValueError, match=r"cannot flatten sparse mesh: strides \[12, 4, 2\]"):
        m.slice(c=slice(0, 4, 2)).flatten("r")
    with pytest.raises(ValueError, match="cannot flatten sparse mesh"):
        m.slice(b=0).flatten("r")


def test_flatten_of_empty_and_zero_dimensional_meshes() -> None:
    assert mesh(["a", "b"], [0, 3]).flatten("r").shape.ndslice.sizes == [0]
    assert RankMesh(Shape.unity()).flatten("r").shape == Shape(["r"], Slice(0, [1], [1]))


def test_flatten_needs_a_str_name(m: RankMesh) -> None:
    with pytest.raises(TypeError, match="got 3"):
        m.flatten(3)  # type: ignore[arg-type]


# -- sizes ---------------------------------------------------------------------


def test_size_sizes_extent_and_len(m: RankMesh) -> None:
    assert m.size() == 24
    assert m.size("b") == 3
    assert m.size(["a", "c"]) == 8
    assert m.size(()) == 1
    assert m.sizes == {"a": 2, "b": 3, "c": 4}
    assert m.extent == Extent(["a", "b", "c"], [2, 3, 4])
    assert len(m) == 24
    assert len(m.slice(a=0, c=slice(1, 3))) == 6


def test_size_of_unknown_dim_raises_key_error_naming_the_dims(m: RankMesh) -> None:
    with pytest.raises(KeyError, match=r"'bb'.*\['a', 'b', 'c'\].*Probably you meant 'b'"):
        m.size("bb")
    with pytest.raises(KeyError, match="'z'"):
        m.size(["a", "z"])


def test_size_refuses_repeated_and_non_string_dims(m: RankMesh) -> None:
    with pytest.raises(ValueError, match="Duplicate dimension name 'a'"):
        m.size(["a", "a"])
    with pytest.raises(TypeError, match="got 3"):
        m.size(3)  # type: ignore[arg-type]


# -- to_table ------------------------------------------------------------------


def test_to_table_lists_each_rank_with_its_index_and_coordinates() -> None:
    m = mesh(["hosts", "gpus"], [2, 2]).slice(gpus=slice(1, 2))
    assert m.to_table() == (
        "index  rank  hosts  gpus\n"
        "-----  ----  -----  ----\n"
        "    0     1      0     0\n"
        "    1     3      1     0"
    )


def test_to_table_of_a_zero_dimensional_mesh_has_one_row() -> None:
    assert RankMesh(Shape.unity()).to_table() == "index  rank\n-----  ----\n    0     0"


def test_to_table_of_an_empty_mesh_has_only_the_header() -> None:
    assert mesh(["a"], [0]).to_table() == "index  rank  a\n-----  ----  -"


def test_labels_and_ndslice_are_there_as_in_monarch(m: RankMesh) -> None:
    # Monarch programs (its spmd_ddp example) read mesh._labels
    assert m._labels == ("a", "b", "c")
    cut = m.slice(a=1, c=slice(0, 4, 2))
    assert cut._labels == ("b", "c")
    assert cut._ndslice == Slice(offset=12, sizes=[3, 2], strides=[4, 2])
