"""Every kernel that exists to test the suite, none of them part of its API:

    wrong_targets/        kernels wrong on purpose (one bug class each), and
                          their declarations: each property's own wrong target
    foreign_targets/      correct kernels written apart from gdn_kernels (a
                          float32 scan, bfloat16-computing chunked kernels, a
                          layer with limits): no false alarm on any of them
    convention_fixtures/  kernels in other conventions, verified through
                          verification.adapt
    author_fixture/       files a kernel author writes in their own directory
                          (copied there by the tests, never imported from here)

The suite's engine never imports them: properties and tests name them by
module ("verification.fixture_kernels.wrong_targets.<name>"), as a user names a
target (verification/tests/test_import_direction.py)."""
